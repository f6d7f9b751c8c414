// @platformatic/kafka scenario driven by tests/test_kafka_platformatic.py: a client that implements only
// the API versions of Kafka 3.5 and later. Admin create, list, describe; produce; a group consumes and
// commits; the committed offsets read back; the group listed and described; the topic deleted.
// Prints one JSON line.
import { createRequire } from 'node:module'
import { pathToFileURL } from 'node:url'

// installed by the test set-up outside this folder: found from NODE_PATH, as CommonJS would
const installed = createRequire(`${process.env.NODE_PATH}/`).resolve('@platformatic/kafka')
const { Admin, Consumer, Producer, stringDeserializers, stringSerializers } = await import(pathToFileURL(installed))

const config = JSON.parse(process.argv[2])
const common = { clientId: 'polygate-test', bootstrapBrokers: [config.broker], retries: 3 }
const steps = []
const explain = (e) => `${e.constructor.name}: ${e.message}` + (e.cause ? ` (${explain(e.cause)})` : '') +
  (e.errors ? ` [${e.errors.map(explain).join('; ')}]` : '')
const step = async (name, run) => {
  try {
    const out = await run()
    steps.push([name, 'ok'])
    return out
  } catch (e) {
    steps.push([name, explain(e)])
    throw e
  }
}

const admin = new Admin(common)
const out = { steps }
try {
  await step('createTopics', () => admin.createTopics({ topics: [config.topic], partitions: 2, replicas: 1 }))
  out.listed = (await step('listTopics', () => admin.listTopics())).includes(config.topic)
  const meta = await step('metadata', () => admin.metadata({ topics: [config.topic] }))
  out.partitions = meta.topics.get(config.topic).partitionsCount

  const producer = new Producer({ ...common, serializers: stringSerializers, autocreateTopics: false })
  const sent = []
  for (let i = 0; i < 6; i++) sent.push({ topic: config.topic, key: `k${i}`, value: `v${i}`, partition: i % 2 })
  await step('produce', () => producer.send({ messages: sent }))
  await producer.close()

  const consumer = new Consumer({ ...common, groupId: config.group, deserializers: stringDeserializers,
    sessionTimeout: 10000, heartbeatInterval: 500, maxWaitTime: 200 })
  const got = []
  await step('consume', async () => {
    const stream = await consumer.consume({ topics: [config.topic], mode: 'earliest', autocommit: false })
    for await (const message of stream) {
      got.push([message.partition, Number(message.offset), message.key, message.value])
      await message.commit()
      if (got.length === sent.length) break
    }
    await stream.close()
  })
  out.consumed = got.sort()
  const offsets = await step('listConsumerGroupOffsets', () => admin.listConsumerGroupOffsets({ groups: [config.group] }))
  out.committed = offsets[0].topics.flatMap((t) => t.partitions.map((p) => [t.name, p.partitionIndex,
    Number(p.committedOffset)])).sort()
  const groups = await step('listGroups', () => admin.listGroups())
  const listed = groups.get(config.group)
  out.group = listed ? [listed.state, listed.groupType, listed.protocolType] : null
  const described = await step('describeGroups', () => admin.describeGroups({ groups: [config.group] }))
  const group = described.get(config.group)
  out.described = [group.state, group.protocolType, group.members.size]
  await consumer.close()
  await step('deleteTopics', () => admin.deleteTopics({ topics: [config.topic] }))
  out.after = (await step('listTopics again', () => admin.listTopics())).includes(config.topic)
} catch (e) {
  out.error = String(e)
} finally {
  await admin.close()
}
console.log(JSON.stringify(out))
process.exit(0) // a client left half-closed after a failed step would keep Node running
