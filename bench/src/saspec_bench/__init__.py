"""The evidence: what measures saspec, never what an engine imports.

Each module imports only modules listed before it (``tests/test_layout.py``
checks that there is no import cycle and that nothing imports ``cli``):

* ``options``: ``CliError``, the option validators and parser classes every command uses;
  ``cpumeter``: how busy other processes kept the CPUs during a timed run;
  ``tokenizers``, ``code_edits``: tokenizers and the code-edit kinds;
  ``models``: installing and loading the real models; ``positions``: a workload as flat
  arrays and each drafter's quality at every output position; ``bench``: host speed and memory.
* ``lm``: the model plumbing (which models, dtype, KV cache, ``CausalLM``).
* ``generate``: the reference speculative loop over HF models; ``draft_runs``: a real
  draft model's exact acceptance from one teacher-forced pass; ``costmodel``: cost profiles;
  ``gate_replay``: the cost gate replayed over the shipped real outputs under cost models.
* ``workloads``: real tokenized workloads and trace files; ``realsim``: costed walks.
* ``record``: real outputs and draft-model runs as shipped data.
* ``simulate``: the acceptance simulator (``saspec simulate``, the main job).
* ``e2e``: the end-to-end benchmark; then ``bench_vllm``: saspec inside vLLM.
* ``cli``: the ``saspec`` command.

The library (``saspec`` outside this package) imports nothing from here.
"""
