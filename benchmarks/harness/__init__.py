"""What every benchmark shares; a new benchmark is one module using it.

- `paths`: where inputs, peers and results are (`models_dir`, `data_dir`, `peer_python`,
  `RESULTS`), and `portable`, which keeps machine paths out of committed reports;
- `launch`: one case in a fresh process, under this interpreter or a peer's
  (`run_worker(module, spec, tmp, timeout_s, python)`; a worker module ends with
  `worker_main(run_spec)`);
- `rounds`: interleaved rounds (`interleave`: every case once per round, the order rotated)
  and paired ratios (`paired`: the median of the rounds' ratios and their range, `ranged`);
- `load`: the quiet-host rule (`LoadWatch`: sample, record, refuse) and its finer tools;
- `machine`: what the host is (`machine_info`, `measure_bandwidth`, `memory_status`);
- `report`: the JSON + markdown writer (`publish`, `--report-only` through `rerender`).

Its modules are imported by their full name; this package imports none of them, so a worker
under a peer's interpreter loads only what it uses.
"""
