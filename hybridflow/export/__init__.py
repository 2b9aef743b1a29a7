"""Checkpoint export: a training checkpoint → a Hugging Face folder (verl's model merger).

:mod:`~hybridflow.export.reader` reads a checkpoint back into the trained module,
:mod:`~hybridflow.export.writer` writes it as a Hugging Face folder (merged, or the LoRA adapter
alone), :mod:`~hybridflow.export.compare` checks a result against a reference folder.
``hybridflow export merge|test`` is the command (:mod:`hybridflow.entrypoints.export`).
"""
