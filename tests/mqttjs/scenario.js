// MQTT.js (npm "mqtt") against a gateway, driven by tests/test_mqtt_websocket.py.
// argv[2] is the JSON config: url (mqtt://, ws://, wss://), ca (a PEM file, for wss://), clientId,
// filter, topic, count, qos. The client subscribes to filter, publishes count messages to topic,
// and prints {"got": [[topic, payload, qos], ...]} once it received count messages.
"use strict";
const fs = require("fs");
const mqtt = require("mqtt");

const cfg = JSON.parse(process.argv[2]);
const options = { clientId: cfg.clientId, protocolVersion: 4, reconnectPeriod: 0, connectTimeout: 10000 };
if (cfg.ca) options.ca = fs.readFileSync(cfg.ca);
const got = [];
const deadline = setTimeout(() => {
  console.error(`timed out with ${got.length} of ${cfg.count} messages`);
  process.exit(1);
}, 30000);

const client = mqtt.connect(cfg.url, options);
client.on("error", (error) => {
  console.error(`MQTT.js error: ${error.message}`);
  process.exit(1);
});
client.on("message", (topic, payload, packet) => {
  got.push([topic, payload.toString(), packet.qos]);
  if (got.length === cfg.count) {
    clearTimeout(deadline);
    client.end(false, {}, () => console.log(JSON.stringify({ got })));
  }
});
client.on("connect", async () => {
  const granted = await client.subscribeAsync(cfg.filter, { qos: 1 });
  if (granted[0].qos !== 1) {
    console.error(`SUBACK ${JSON.stringify(granted)}`);
    process.exit(1);
  }
  for (let i = 0; i < cfg.count; i++) {
    await client.publishAsync(cfg.topic, `m${i}`, { qos: cfg.qos });
  }
});
