"""General-purpose methods every paper compares with: FedAvg, FedProx, FedOpt (FedAdam, FedYogi),
FedAsync, FedBuff, CA2FL, the ``damp`` and ``clip_step`` mixers and the ``corrupt`` and
``scale_update`` behaviours."""
