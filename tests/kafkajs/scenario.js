// kafkajs 2.2 scenarios driven by tests/test_kafka_kafkajs.py; prints one JSON line.
const { Kafka, CompressionTypes, CompressionCodecs, logLevel } = require('kafkajs');
const SnappyCodec = require('kafkajs-snappy');

CompressionCodecs[CompressionTypes.Snappy] = SnappyCodec;

const config = JSON.parse(process.argv[2]);
const kafka = new Kafka({ clientId: 'polygate-test', brokers: [config.broker], logLevel: logLevel.NOTHING });
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function waitFor(check, what, timeoutMs = 30000) {
  const deadline = Date.now() + timeoutMs;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(50);
  }
}

async function produceConsume() {
  const producer = kafka.producer();
  await producer.connect();
  const sent = [];
  for (const [name, codec] of [['none', CompressionTypes.None], ['gzip', CompressionTypes.GZIP],
    ['snappy', CompressionTypes.Snappy]]) {
    const messages = [];
    for (let i = 0; i < 4; i++) {
      messages.push({ key: `${name}-k${i}`, value: `${name}-v${i}`, headers: { codec: name }, partition: 0 });
    }
    messages.push({ value: `${name}-unkeyed`, partition: 0 });
    await producer.send({ topic: config.topic, compression: codec, messages });
    sent.push(...messages.map((m) => [m.key || null, m.value, m.headers ? m.headers.codec : null]));
  }
  await producer.disconnect();

  const read = async (groupId, fromBeginning, count) => {
    const consumer = kafka.consumer({ groupId, heartbeatInterval: 200, maxWaitTimeInMs: 300 });
    await consumer.connect();
    await consumer.subscribe({ topic: config.topic, fromBeginning });
    const got = [];
    await consumer.run({
      autoCommit: false,
      eachMessage: async ({ message }) => {
        got.push([message.key ? message.key.toString() : null, message.value.toString(),
          message.headers.codec ? message.headers.codec.toString() : null, Number(message.offset)]);
      },
    });
    await waitFor(() => got.length >= count, `${count} messages`);
    return [consumer, got];
  };

  const [first, all] = await read(config.group, true, sent.length);
  await first.commitOffsets([{ topic: config.topic, partition: 0, offset: '3' }]);
  await first.disconnect();
  const [second, rest] = await read(config.group, true, sent.length - 3);
  await second.disconnect();
  console.log(JSON.stringify({ sent, all, rest }));
}

async function group() {
  const admin = kafka.admin();
  await admin.connect();
  await admin.createTopics({ topics: [{ topic: config.topic, numPartitions: 4 }] });
  await admin.disconnect();
  const member = async () => {
    const consumer = kafka.consumer({ groupId: config.group, heartbeatInterval: 200, sessionTimeout: 6000, maxWaitTimeInMs: 300 });
    const state = { consumer, owned: [] };
    consumer.on(consumer.events.GROUP_JOIN, (e) => {
      state.owned = (e.payload.memberAssignment[config.topic] || []).slice().sort();
    });
    await consumer.connect();
    await consumer.subscribe({ topic: config.topic });
    await consumer.run({ eachMessage: async () => {} });
    return state;
  };
  const a = await member();
  await waitFor(() => a.owned.length === 4, 'first member owns everything');
  const b = await member();
  await waitFor(() => a.owned.length === 2 && b.owned.length === 2, 'two members share the partitions');
  const split = [a.owned, b.owned];
  await b.consumer.disconnect();
  await waitFor(() => a.owned.length === 4, 'survivor owns everything again');
  const after = a.owned;
  await a.consumer.disconnect();
  console.log(JSON.stringify({ split, after }));
}

async function transactions() {
  // A committed and an aborted transaction, then consume-transform-produce with sendOffsets.
  const producer = kafka.producer({ transactionalId: config.transactionalId, maxInFlightRequests: 1,
    idempotent: true });
  await producer.connect();
  for (const [values, commit] of [[['c0', 'c1'], true], [['a0'], false]]) {
    const txn = await producer.transaction();
    await txn.send({ topic: config.topic, messages: values.map((value) => ({ value, partition: 0 })) });
    await (commit ? txn.commit() : txn.abort());
  }
  const txn = await producer.transaction();
  await txn.send({ topic: config.output, messages: [{ value: 'derived', partition: 0 }] });
  await txn.sendOffsets({ consumerGroupId: config.group,
    topics: [{ topic: config.topic, partitions: [{ partition: 0, offset: '2' }] }] });
  await txn.commit();
  await producer.disconnect();

  const read = async (topic, readUncommitted) => {
    const consumer = kafka.consumer({ groupId: `${config.group}-${topic}-${readUncommitted}`, readUncommitted,
      maxWaitTimeInMs: 300 });
    await consumer.connect();
    await consumer.subscribe({ topic, fromBeginning: true });
    const got = [];
    await consumer.run({ eachMessage: async ({ message }) => { got.push([Number(message.offset), message.value.toString()]); } });
    await sleep(2500);
    await consumer.disconnect();
    return got;
  };
  const admin = kafka.admin();
  await admin.connect();
  const offsets = await admin.fetchOffsets({ groupId: config.group, topics: [config.topic] });
  await admin.disconnect();
  console.log(JSON.stringify({ committed: await read(config.topic, false), uncommitted: await read(config.topic, true),
    output: await read(config.output, false), offsets: offsets[0].partitions.map((p) => [p.partition, p.offset]) }));
}

({ 'produce-consume': produceConsume, group, transactions })[config.mode]().then(
  () => process.exit(0),
  (e) => { console.error(e && e.stack ? e.stack : e); process.exit(1); },
);
