"""`store bench mix`: a LinkBench-style mixed workload over threads, the store beside a floor and a peer.

`workload` makes the data set and the request stream (in data-set indices,
the same for every system), `system` holds the `System` protocol,
`store_system` the store's adapter, `floor` the hand-written floor, `peer`
SQLAlchemy's ``horizontal_shard`` extension; `options` says what a run is
asked for and `systems` builds each system by its name; `runner` loads,
runs and checks, `report` prints the tables and writes the JSON and the
charts, and `bench` runs the whole.
"""
