"""The simulation itself, free of Ray: the virtual clock (``clock``), client delays (``delays``)
and how a run's model, data and server context are built (``build``)."""
