"""Collective algorithms on stacked per-rank buffers: the ring and the trees (``ring``,
``tree``), all-to-all (``all_to_all``), the record of one communication step (``steps``),
the reduce ops (``reduce_ops``), the plans the engine runs (``step_plans``), the global view
a notebook steps through (``global_view``), one entry of a point-to-point batch
(``p2p_op``: ``P2POp``), lesson 00's ring written with point to point (``p2p_ring``) and a
recorder for hand-written global-view steps (``hand_traced``)."""
