"""The supervised trainers: SFT (:mod:`~hybridflow.trainer.supervised.sft_trainer`, the NLL loss in
``sft_loss``) and the Bradley–Terry reward model (:mod:`~hybridflow.trainer.supervised.rm_trainer`,
``rm_loss``), both on the shared loop of :mod:`~hybridflow.trainer.supervised.base`."""
