"""The engine of ranks and rendezvous: ``World`` runs one greenlet per rank (``world``); a
rank's ``Comm`` joins collectives and point-to-point transfers (``comm``, ``p2p``,
``rendezvous``); ``clock`` keeps every rank's streams on the simulated clock."""
