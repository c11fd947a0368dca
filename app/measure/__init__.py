"""Measuring the algorithms and tunnels of this machine: `qoss bench`.

Layered like the product around it: ``domain`` is pure (what a measurement is, how runs
become a rating table and a report), ``adapters`` touch the machine (OpenSSL micro
benchmarks, iperf3 and ping through real tunnels, the plots), ``services`` runs micro
benchmarks as API jobs, and ``cli_tunnel`` is the `qoss bench tunnel` command. Plotting
needs the ``bench`` extra (``pip install 'qoss[bench]'``, matplotlib); nothing else here does.
"""
