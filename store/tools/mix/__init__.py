"""`store bench mix`: a LinkBench-style mixed workload over threads, the store beside a floor and a peer.

`workload` makes the data set and the request stream (in data-set indices,
the same for every system), `systems` holds the `System` protocol with the
store's adapter and the hand-written floor, `peer` SQLAlchemy's
``horizontal_shard`` extension, `runner` loads, runs and checks, `report`
prints the tables and writes the JSON and the charts.
"""
