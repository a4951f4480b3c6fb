// kafkajs transactions driven by tests/e2e/test_transactions.py: one transaction of 9 records
// that commits together with offsets sent for GROUP (offset 3 on each of TOPIC's 3 partitions),
// then one of 9 records that aborts. Prints one JSON line with the counts.
// Usage: node transactions.js BOOTSTRAP TOPIC GROUP TRANSACTIONAL_ID
const { Kafka, logLevel } = require("kafkajs");

async function main() {
  const [bootstrap, topic, group, transactionalId] = process.argv.slice(2);
  const kafka = new Kafka({ clientId: "kbroker-e2e-txn", brokers: [bootstrap],
                            logLevel: logLevel.WARN, retry: { retries: 8 } });
  const producer = kafka.producer({ transactionalId, idempotent: true, maxInFlightRequests: 1 });
  await producer.connect();
  const kept = await producer.transaction();
  const keptMessages = [];
  for (let i = 0; i < 9; i++) keptMessages.push({ partition: i % 3, value: `js-kept-${i}` });
  await kept.send({ topic, messages: keptMessages });
  await kept.sendOffsets({ consumerGroupId: group, topics: [{ topic, partitions: [
    { partition: 0, offset: "3" }, { partition: 1, offset: "3" }, { partition: 2, offset: "3" },
  ] }] });
  await kept.commit();

  const dropped = await producer.transaction();
  const droppedMessages = [];
  for (let i = 0; i < 9; i++) droppedMessages.push({ partition: i % 3, value: `js-dropped-${i}` });
  await dropped.send({ topic, messages: droppedMessages });
  await dropped.abort();
  await producer.disconnect();
  process.stdout.write(JSON.stringify({ committed: keptMessages.length,
                                        aborted: droppedMessages.length }) + "\n");
}

main().catch((err) => { console.error(err); process.exit(1); });
