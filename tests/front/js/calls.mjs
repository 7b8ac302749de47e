// The same calls through @gradio/client, unmodified, against one URL (the Space, the
// front, or a proxy spreading requests over workers); prints JSON.
// node calls.mjs <shapes url> <media url> <file to upload>
import { Client, handle_file } from "@gradio/client";
import { readFileSync } from "node:fs";

const [shapesUrl, mediaUrl, uploadPath] = process.argv.slice(2);
const headers = JSON.parse(process.env.SPACEPOOL_HEADERS || "{}");

async function run() {
  const shapes = await Client.connect(shapesUrl, { headers });
  const multi = (await shapes.predict("/multi", ["hi", 2, true])).data;
  const partials = [];
  for await (const msg of shapes.submit("/count", ["ab", 3])) {
    if (msg.type === "data") partials.push(msg.data);
    if (msg.type === "status" && msg.stage === "error") throw new Error(msg.message);
  }
  const chat = [];
  for (const word of ["a", "b", "c"]) {
    chat.push((await shapes.predict("/history", [word])).data[0]);
  }
  const bundle = (await shapes.predict("/bundle", ["lines", 2])).data;
  const file = bundle[0];
  const fileBody = await (await fetch(file.url, { headers })).text();
  shapes.close();
  const media = await Client.connect(mediaUrl, { headers });
  const blob = new Blob([readFileSync(uploadPath)]);
  const checksum = (await media.predict("/checksum", [handle_file(blob)])).data;
  media.close();
  return { multi, partials, chat, text: bundle[3], fileUrl: file.url, fileBody, checksum };
}

run().then(
  (out) => { console.log(JSON.stringify(out)); process.exit(0); },
  (err) => { console.error(String(err && err.stack || err)); process.exit(1); },
);
