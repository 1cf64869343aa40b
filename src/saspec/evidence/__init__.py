"""The evidence: what measures saspec, never what an engine imports.

* ``tokenizers``, ``workloads``, ``code_edits``: real tokenized workloads.
* ``simulate``: the acceptance simulator (the ``saspec simulate`` main job).
* ``bench``: host speed and memory benchmarks.
* ``models``, ``generate``, ``e2e``: model set-up, the reference speculative
  loop over HF models, and the end-to-end benchmark.
* ``cli``: the ``saspec`` command.

The library (``saspec`` outside this package) imports nothing from here.
"""
