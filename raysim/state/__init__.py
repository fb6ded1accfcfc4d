"""What a run keeps to continue: checkpoints (``checkpoint``, their files ``checkpoint_files``,
their encoding ``codec``) and the clients' personal state (``store``)."""
