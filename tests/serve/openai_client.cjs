// The `openai` npm package (a client phasescope did not write) against `phasescope serve`
// (tests/serve/test_probe.sh): usage: node openai_client.cjs PORT NPM_DIR
// Lists the models, asks for a completion with echo and logprobs (text prompt and token-id prompt),
// checks the answer's shape as the OpenAI completions format has it, streams the same greedy completion
// (stream: true, read with the client's own server-sent-events reader: the chunks' texts and tokens make
// up the answer in one piece, finish_reason "length", the usage chunk), and that a refused request comes
// back as the client's BadRequestError (status 400). Exits non-zero with a message on any mismatch.
const path = require("path");
const [port, npmDir] = process.argv.slice(2);
const OpenAI = require(path.join(npmDir, "node_modules", "openai"));

function check(cond, what) {
  if (!cond) {
    console.error("openai client: " + what);
    process.exit(1);
  }
}

(async () => {
  const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: "not-needed", maxRetries: 0, timeout: 60000 });
  const models = await client.models.list();
  const model = models.data[0].id;
  check(typeof model === "string" && model.length > 0, "no model listed");

  const prompt = "The value of apple is";
  const r = await client.completions.create({ model, prompt, max_tokens: 2, temperature: 0, echo: true, logprobs: 2 });
  check(r.object === "text_completion" && r.choices.length === 1, "not one text_completion choice");
  const c = r.choices[0], lp = c.logprobs;
  check(typeof c.text === "string" && c.text.startsWith(prompt), "echoed text does not start with the prompt: " + JSON.stringify(c.text));
  const n = lp.tokens.length;
  check(n === r.usage.prompt_tokens + 2 && r.usage.completion_tokens === 2, `tokens ${n}, usage ${JSON.stringify(r.usage)}`);
  check(lp.token_logprobs.length === n && lp.top_logprobs.length === n && lp.text_offset.length === n, "logprobs arrays differ in length");
  check(lp.token_logprobs[0] === null && lp.top_logprobs[0] === null, "the first token has a log-probability");
  let text = "";
  for (let i = 0; i < n; i++) {
    check(lp.text_offset[i] === text.length, `text_offset[${i}] = ${lp.text_offset[i]}, expected ${text.length}`);
    text += lp.tokens[i];
    if (i === 0) continue;
    check(typeof lp.token_logprobs[i] === "number" && lp.token_logprobs[i] <= 0, `token_logprobs[${i}]`);
    const top = Object.values(lp.top_logprobs[i]);
    check(top.length >= 1 && top.length <= 3, `top_logprobs[${i}] has ${top.length} entries`);
    check(Math.max(...top) >= lp.token_logprobs[i] - 1e-12, `top_logprobs[${i}] misses a better token`);
  }
  check(text === c.text, "the tokens do not make up the text");

  const ids = await client.completions.create({ model, prompt: [1, 2, 3, 4], max_tokens: 1, temperature: 0, logprobs: 0 });
  check(ids.choices[0].logprobs.tokens.length === 1 && ids.usage.prompt_tokens === 4, "token-id prompt");

  const greedy = { model, prompt, max_tokens: 4, temperature: 0, logprobs: 1 };
  const plain = await client.completions.create(greedy);
  const stream = await client.completions.create({ ...greedy, stream: true, stream_options: { include_usage: true } });
  let stext = "", stoks = [], finish = null, usage = null, chunks = 0;
  for await (const ch of stream) {
    chunks++;
    check(ch.object === "text_completion", "a chunk is not a text_completion");
    if (ch.usage) usage = ch.usage;
    for (const sc of ch.choices) {
      check(finish === null, "a chunk after the choice's finish_reason");
      stext += sc.text;
      stoks.push(...sc.logprobs.tokens);
      finish = sc.finish_reason || null;
    }
  }
  check(stext === plain.choices[0].text, `streamed text ${JSON.stringify(stext)} is not ${JSON.stringify(plain.choices[0].text)}`);
  check(JSON.stringify(stoks) === JSON.stringify(plain.choices[0].logprobs.tokens), "streamed tokens differ");
  check(finish === "length" && usage && usage.completion_tokens === 4, `finish ${finish}, usage ${JSON.stringify(usage)}`);

  let refused = false;
  try {
    await client.completions.create({ model, prompt, max_tokens: 1, logprobs: 1000 });
  } catch (e) {
    refused = e instanceof OpenAI.BadRequestError && e.status === 400 && /max-logprobs/.test(e.message);
    if (!refused) console.error(e);
  }
  check(refused, "logprobs 1000 was not refused with a 400 naming --max-logprobs");
  console.log(`openai client: ${model}: echo + logprobs over ${n} tokens, token-id prompt, a stream of ${chunks} chunks equal to the answer in one piece, 400 on a limit: all well-formed`);
})().catch((e) => {
  console.error("openai client: " + (e && e.stack ? e.stack : e));
  process.exit(1);
});
