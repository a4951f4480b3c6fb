// kafkajs driven by tests/e2e/test_kafkajs.py: consume COUNT messages of TOPIC through the
// consumer group GROUP, committing each message's offset before counting it, then leave the
// group. Prints one JSON line: what was processed, how often the consumer joined the group, and
// what kafkajs warned about.
// Usage: node consume_group.js BOOTSTRAP TOPIC GROUP COUNT
const { Kafka, logLevel } = require("kafkajs");

async function main() {
  const [bootstrap, topic, groupId, countArg] = process.argv.slice(2);
  const count = Number(countArg);
  const warnings = [];
  const logCreator = () => ({ level, log }) => {
    if (level <= logLevel.WARN) {
      warnings.push({ timestamp: log.timestamp, message: log.message, error: log.error });
    }
  };
  const kafka = new Kafka({ clientId: "kbroker-e2e-group", brokers: [bootstrap],
                            logLevel: logLevel.WARN, logCreator, retry: { retries: 5 } });
  const consumer = kafka.consumer({ groupId, heartbeatInterval: 1000 });
  let joins = 0;
  consumer.on(consumer.events.GROUP_JOIN, () => { joins += 1; });
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  const processed = [];
  const started = Date.now();
  let done;
  const finished = new Promise((resolve) => { done = resolve; });
  await consumer.run({
    autoCommit: false,
    eachMessage: async ({ partition, message }) => {
      const offset = Number(message.offset);
      // A message counts once its commit succeeded. A commit refused while the group rebalances
      // (or its coordinator moves) throws, the consumer joins again, and the group hands the
      // message out again from the committed offset, as Kafka's at-least-once delivery does.
      await consumer.commitOffsets([{ topic, partition, offset: String(offset + 1) }]);
      processed.push({ partition, offset, value: message.value.toString() });
      if (processed.length >= count) done();
    },
  });
  const timer = setTimeout(done, 60000);
  await finished;
  clearTimeout(timer);
  await consumer.disconnect();
  process.stdout.write(JSON.stringify({ processed, joins, warnings,
                                        seconds: (Date.now() - started) / 1000 }) + "\n");
}

main().catch((err) => { console.error(err); process.exit(1); });
