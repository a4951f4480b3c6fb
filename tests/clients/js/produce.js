// kafkajs driven by tests/e2e/test_kafkajs.py: create a topic, then produce COUNT messages per
// codec with keys, headers and timestamps. Prints one JSON line describing what was sent.
// Usage: node produce.js BOOTSTRAP TOPIC PARTITIONS COUNT CODEC...
const { Kafka, CompressionTypes, CompressionCodecs, logLevel } = require("kafkajs");
const SnappyCodec = require("kafkajs-snappy");
const lz4 = require("lz4js");
const zstd = require("@bokuweb/zstd-wasm");

// kafkajs ships gzip only; the other codecs are plugins. The published lz4/zstd plugins are
// native addons that no longer build on current Node, so these two wrap pure JS / WebAssembly
// codecs (LZ4 frame format and zstd frames, as Kafka uses).
const pureCodec = (compress, decompress) => () => ({
  compress: async (encoder) => Buffer.from(compress(encoder.buffer)),
  decompress: async (buffer) => Buffer.from(decompress(buffer)),
});
CompressionCodecs[CompressionTypes.Snappy] = SnappyCodec;
CompressionCodecs[CompressionTypes.LZ4] = pureCodec(lz4.compress, lz4.decompress);
CompressionCodecs[CompressionTypes.ZSTD] = pureCodec((b) => zstd.compress(b, 3), zstd.decompress);
const CODECS = { none: CompressionTypes.None, gzip: CompressionTypes.GZIP,
                 snappy: CompressionTypes.Snappy, lz4: CompressionTypes.LZ4,
                 zstd: CompressionTypes.ZSTD };

async function main() {
  await zstd.init();
  const [bootstrap, topic, partitionsArg, countArg, ...codecs] = process.argv.slice(2);
  const partitions = Number(partitionsArg);
  const count = Number(countArg);
  const kafka = new Kafka({ clientId: "kbroker-e2e", brokers: [bootstrap],
                            logLevel: logLevel.WARN, retry: { retries: 5 } });
  const admin = kafka.admin();
  await admin.connect();
  const created = await admin.createTopics({ topics: [{ topic, numPartitions: partitions,
                                                        replicationFactor: 1 }],
                                             waitForLeaders: true, timeout: 15000 });
  await admin.disconnect();
  const producer = kafka.producer({ allowAutoTopicCreation: false });
  await producer.connect();
  const sent = [];
  const base = 1700000000000;
  for (const codec of codecs) {
    const messages = [];
    for (let i = 0; i < count; i++) {
      const m = { partition: i % partitions, key: `${codec}-key-${i}`,
                  value: `${codec}-value-${i}-`.repeat(1 + (i % 5)),
                  headers: { origin: `kafkajs-${codec}` }, timestamp: String(base + i) };
      messages.push(m);
      sent.push({ ...m, timestamp: base + i });
    }
    const result = await producer.send({ topic, acks: -1, compression: CODECS[codec], messages });
    for (const r of result) {
      if (r.errorCode !== 0) throw new Error(`produce error ${JSON.stringify(r)}`);
    }
  }
  await producer.disconnect();
  process.stdout.write(JSON.stringify({ created, sent }) + "\n");
}

main().catch((err) => { console.error(err); process.exit(1); });
