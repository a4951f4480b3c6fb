// kafkajs over SASL, driven by tests/e2e/test_sasl.py: create TOPIC, produce COUNT messages
// ("0".."COUNT-1" to partition 0), authenticated with MECHANISM (plain, scram-sha-256,
// scram-sha-512); over TLS trusting CAFILE when one is given. Prints one JSON line.
// Usage: node sasl_produce.js BOOTSTRAP TOPIC COUNT MECHANISM USER PASSWORD [CAFILE]
const fs = require("fs");
const { Kafka, logLevel } = require("kafkajs");

async function main() {
  const [bootstrap, topic, countArg, mechanism, username, password, cafile] =
    process.argv.slice(2);
  const kafka = new Kafka({
    clientId: "kbroker-e2e-sasl", brokers: [bootstrap], logLevel: logLevel.WARN,
    retry: { retries: 3 },
    ssl: cafile ? { ca: [fs.readFileSync(cafile, "utf-8")] } : false,
    sasl: { mechanism, username, password },
  });
  const admin = kafka.admin();
  await admin.connect();
  const created = await admin.createTopics({ topics: [{ topic, numPartitions: 1 }] });
  await admin.disconnect();
  const producer = kafka.producer();
  await producer.connect();
  const count = Number(countArg);
  const messages = Array.from({ length: count }, (_, i) => ({ value: String(i), partition: 0 }));
  await producer.send({ topic, messages, acks: -1 });
  await producer.disconnect();
  console.log(JSON.stringify({ created, sent: count }));
}

main().catch((e) => { console.error(e); process.exit(1); });
