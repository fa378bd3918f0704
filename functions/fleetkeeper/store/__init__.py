"""The one table: every key, index and condition expression fleetkeeper uses lives in this package.

Split by reader; import from the module you need (this file imports nothing, so importing one
module costs only that module):

    keys        where each item lives: keys, prefixes, the services index          (pure)
    codec       records <-> items, a partition -> ServiceState, page tokens          (pure)
    specs       stored specs, validated once per text (a bounded cache)
    errors      the typed facts the store raises instead of doing what it was asked
    table       Table (the client holder, paginated queries), DynamoDB's call limits
    reads       ServiceReads: one service, the services index
    commands    CommandStore: the api's reads and writes of target state
    reconciler  ReconcilerStore: a run's reads and its conditional writes
    cleanup     ChildKeys, partition_uids: one removed incarnation's children
    idempotency where Powertools idempotency keeps its records
"""
