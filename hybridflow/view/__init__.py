"""Looking at runs: the curves of a run as a PNG (:mod:`hybridflow.view.plot`)."""
