// MQTT.js through a Headwater node: `node pubsub.js <url> <topic>`.
//
// Connects (e.g. ws://127.0.0.1:PORT/mqtt, MQTT 3.1.1), subscribes to <topic> at QoS 1,
// publishes one message to it at QoS 1, and waits for that message to come back through the
// node.  Prints one JSON line per step ({"step": "connected"}, ..., {"step": "received", ...})
// and exits 0 once the message is back; exits 1 on any error or after 10 seconds.
"use strict";

const mqtt = require("mqtt");

const [url, topic] = process.argv.slice(2);
if (!url || !topic) {
  console.error("usage: node pubsub.js <url> <topic>");
  process.exit(2);
}
const payload = `hello from MQTT.js ${process.pid}`;
const say = (step, extra = {}) => console.log(JSON.stringify({ step, ...extra }));
let done = false;
const fail = (why) => {
  if (done) return; // the message is back: what happens while closing does not matter
  console.error(`pubsub.js: ${why}`);
  process.exit(1);
};
setTimeout(() => fail("timed out"), 10000).unref();

const client = mqtt.connect(url, {
  protocolVersion: 4,
  clientId: `mqttjs-${process.pid}`,
  reconnectPeriod: 0,
  connectTimeout: 5000,
});
client.on("error", (error) => fail(error.message));
client.on("connect", () => {
  say("connected");
  client.subscribe(topic, { qos: 1 }, (error, granted) => {
    if (error) return fail(`subscribe: ${error.message}`);
    say("subscribed", { granted: granted.map((g) => g.qos) });
    client.publish(topic, payload, { qos: 1 }, (error) => {
      if (error) return fail(`publish: ${error.message}`);
      say("published");
    });
  });
});
client.on("message", (got, message, packet) => {
  if (got !== topic || message.toString() !== payload) return;
  done = true;
  say("received", { topic: got, payload: message.toString(), qos: packet.qos });
  client.end(false, {}, () => process.exit(0));
});
