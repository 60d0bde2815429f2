"""walkit.adapters.topics is a Kafka-compatible broker whose topic partitions are walkit logs.

    walkit topics serve                    # embedded cluster under ./walkit-data, port 9092
    kcat -b 127.0.0.1:9092 -t greetings -P <<< hello

kafka-python, confluent-kafka (librdkafka) and kcat work unchanged. Modules:

- wire.py, versions.py, errors.py: framing, the supported API versions, error codes; the
  request and response bodies are kafka-python's `kafka.protocol` messages;
- batches.py: record batches as producers send them (CRC checked, renumbered);
- partition.py, producers.py, offsets.py: the replicated state machines (apply, snapshot,
  restore) of a partition and of a group bucket's committed offsets; epochs.py: a partition's
  leader epochs; acls.py: the ACL bindings (stored, not enforced);
- leader.py: a partition on this broker: its walkit.replicate machine (every broker applies
  every partition's log, so followers are hot) and, while it leads, produce, fetch, retention;
- ownership.py, catalog.py: a node of every slot on every broker and which broker should
  lead each (walkit.replicate elects, fences and snapshots); topics and brokers in the
  metadata store;
- coordinator.py: consumer group membership; transactions.py, txncoordinator.py: Kafka
  transactions (an id's state in its group bucket, markers, the coordinator); broker.py,
  server.py, handlers/: the broker, its connections and one module per family of requests;
  service.py: `walkit topics serve`; sasl.py, scram.py: the logins it takes; cli.py: the
  commands, and credentials.py: how the client commands reach a broker and log in (SASL, TLS).
"""
