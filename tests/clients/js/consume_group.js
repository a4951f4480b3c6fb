// kafkajs driven by tests/e2e/test_kafkajs.py: consume COUNT messages of TOPIC through the
// consumer group GROUP (committing after each message), then leave the group. Prints one JSON
// line with what was consumed.
// Usage: node consume_group.js BOOTSTRAP TOPIC GROUP COUNT
const { Kafka, logLevel } = require("kafkajs");

async function main() {
  const [bootstrap, topic, groupId, countArg] = process.argv.slice(2);
  const count = Number(countArg);
  const kafka = new Kafka({ clientId: "kbroker-e2e-group", brokers: [bootstrap],
                            logLevel: logLevel.WARN, retry: { retries: 5 } });
  const consumer = kafka.consumer({ groupId, heartbeatInterval: 1000 });
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  const consumed = [];
  const started = Date.now();
  let done;
  const finished = new Promise((resolve) => { done = resolve; });
  await consumer.run({
    autoCommit: true,
    autoCommitThreshold: 1,
    eachMessage: async ({ partition, message }) => {
      consumed.push({ partition, offset: Number(message.offset),
                      value: message.value.toString() });
      if (consumed.length >= count) done();
    },
  });
  const timer = setTimeout(done, 60000);
  await finished;
  clearTimeout(timer);
  await consumer.disconnect();
  process.stdout.write(JSON.stringify({ consumed, seconds: (Date.now() - started) / 1000 }) + "\n");
}

main().catch((err) => { console.error(err); process.exit(1); });
