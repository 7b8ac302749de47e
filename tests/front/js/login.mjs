// @gradio/client against a Space behind Gradio's login, through one URL; prints JSON.
// node login.mjs <url> <username> <password> <file to upload>
import { Client, handle_file } from "@gradio/client";
import { readFileSync } from "node:fs";

const [url, username, password, uploadPath] = process.argv.slice(2);
const headers = JSON.parse(process.env.SPACEPOOL_HEADERS || "{}");

async function run() {
  let refused = null;
  try {
    (await Client.connect(url, { headers })).close();
  } catch (err) {
    refused = String(err && err.message || err);
  }
  const app = await Client.connect(url, { headers, auth: [username, password] });
  const blob = new Blob([readFileSync(uploadPath)]);
  const checksum = (await app.predict("/checksum", [handle_file(blob)])).data;
  app.close();
  return { refused, checksum };
}

run().then(
  (out) => { console.log(JSON.stringify(out)); process.exit(0); },
  (err) => { console.error(String(err && err.stack || err)); process.exit(1); },
);
