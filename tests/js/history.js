// MQTT.js reading history from a Headwater node: `node history.js <url> <filter> <count>`.
//
// Connects (MQTT 3.1.1), subscribes to <filter> (e.g. $history/10m/a/#) at QoS 1 and prints
// one JSON line per message ({"topic": ..., "payload": ..., "qos": ...}) until <count> came;
// exits 0 then, 1 on any error or after 20 seconds.
"use strict";

const mqtt = require("mqtt");

const [url, filter, countText] = process.argv.slice(2);
const count = Number(countText);
if (!url || !filter || !(count > 0)) {
  console.error("usage: node history.js <url> <filter> <count>");
  process.exit(2);
}
let received = 0;
const fail = (why) => {
  if (received >= count) return;
  console.error(`history.js: ${why} (${received} of ${count} received)`);
  process.exit(1);
};
setTimeout(() => fail("timed out"), 20000).unref();

const client = mqtt.connect(url, {
  protocolVersion: 4,
  clientId: `mqttjs-history-${process.pid}`,
  reconnectPeriod: 0,
  connectTimeout: 5000,
});
client.on("error", (error) => fail(error.message));
client.on("connect", () => {
  client.subscribe(filter, { qos: 1 }, (error, granted) => {
    if (error) return fail(`subscribe: ${error.message}`);
    if (granted[0].qos !== 1) fail(`granted ${granted[0].qos}`);
  });
});
client.on("message", (topic, message, packet) => {
  console.log(JSON.stringify({ topic, payload: message.toString(), qos: packet.qos }));
  received += 1;
  if (received === count) client.end(false, {}, () => process.exit(0));
});
