"""The engine of ranks and rendezvous: ``World`` runs one greenlet per rank (``world``); a
rank's ``Comm`` joins collectives and point-to-point transfers (``comm``, ``collectives``,
``p2p``, ``rendezvous``) and charges its compute (``rank_compute``); ``clock`` keeps every
rank's streams on the simulated clock."""
