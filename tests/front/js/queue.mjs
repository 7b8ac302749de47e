// N @gradio/client clients, unmodified, each its own user, submit /echo(text, delay_s) at
// once against one URL; prints JSON: each one's result and the queue positions its
// "pending" statuses showed (the estimation messages), in order.
// node queue.mjs <url> <clients> <delay_s>
import { Client } from "@gradio/client";

const [url, count, delay] = process.argv.slice(2);
const base = JSON.parse(process.env.SPACEPOOL_HEADERS || "{}");

async function one(i) {
  const headers = { ...base, "X-Spacepool-User": `js${i}@example.com` };
  const client = await Client.connect(url, { headers, events: ["data", "status"] });
  const positions = [];
  let result = null;
  for await (const msg of client.submit("/echo", [`j${i}`, Number(delay)])) {
    if (msg.type === "status" && msg.stage === "error") throw new Error(msg.message);
    if (msg.type === "status" && msg.stage === "pending" && typeof msg.position === "number") {
      if (positions.at(-1) !== msg.position) positions.push(msg.position);
    }
    if (msg.type === "data") result = msg.data[0];
    if (msg.type === "status" && msg.stage === "complete") break;
  }
  client.close();
  return { result, positions };
}

const runs = [];
for (let i = 0; i < Number(count); i++) runs.push(one(i));
Promise.all(runs).then(
  (out) => { console.log(JSON.stringify(out)); process.exit(0); },
  (err) => { console.error(String(err && err.stack || err)); process.exit(1); },
);
