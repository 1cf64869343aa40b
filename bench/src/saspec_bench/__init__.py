"""saspec-bench: what measures saspec, never what an engine imports.

The layers, each importing only the ones above it (``tests/test_layout.py`` checks
that there is no cycle, that commands never import each other and that nothing
imports ``cli``):

* **data and options**: ``datafiles`` (where the shipped recordings and the CPU
  profile live), ``options`` (``CliError`` and the option validators every
  command uses), ``cpumeter`` (how busy other processes kept the CPUs);
* **workloads**: ``tokenizers``, ``code_edits`` (the code-edit kinds),
  ``draft_runs`` (a real draft model's exact acceptance from one teacher-forced
  pass), ``workloads`` (real tokenized workloads and trace files),
  ``cross_requests`` (workloads that repeat across requests), ``prompts`` (what
  the end-to-end benchmarks send), ``synthetic`` (random and code-like streams);
* **models**: ``models`` (installing the real models from PyPI), ``lm`` (loading
  them: dtype, KV cache), ``loop`` (the own speculative loop over HF models);
* **measurement**: ``positions`` (a workload as flat arrays, each drafter's
  quality at every position), ``acceptance`` (the acceptance simulator's walks),
  ``costmodel`` (step-cost profiles), ``realsim`` (costed walks), ``pool_sim``
  (the cross-request pool replayed), ``gate_replay``;
* **commands** (``commands/``: simulate, bench, e2e, record, calibrate,
  bench_vllm, proposer_cost) and **studies** (``studies/``: one-off measurements);
* ``cli``: the ``saspec`` command.

The library (``saspec``) imports nothing from here.
"""
