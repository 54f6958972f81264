// SPDX-License-Identifier: MIT
/*
 * Description: a chat through node-llama-cpp (the npm package tools/bootstrap.sh
 * installs), greedy, for tests/llama/check_preload.py to run with and without
 * libmoepager-preload.so.
 *
 *   node chat.mjs LLAMA_DIR MODEL.gguf QUESTION
 *
 * Prints one JSON line: the chat answer and its token ids, and a plain
 * completion of the question with its token ids.
 */
import {createRequire} from "node:module";
import {pathToFileURL} from "node:url";

const [llamaDir, modelPath, question] = process.argv.slice(2);
const require = createRequire(llamaDir + "/package.json");
const {getLlama, LlamaChatSession, LlamaCompletion} =
    await import(pathToFileURL(require.resolve("node-llama-cpp")).href);

const llama = await getLlama({gpu: false, build: "never", logLevel: "error"});
const model = await llama.loadModel({modelPath});
// one thread: a shared machine's busy cores make ggml's spinning threads crawl
const context = await model.createContext({contextSize: 256, threads: 1, sequences: 2});
const chatIds = [], completionIds = [];
const session = new LlamaChatSession({contextSequence: context.getSequence()});
const answer = await session.prompt(question, {
    maxTokens: 24, temperature: 0, onToken: (t) => chatIds.push(...t)});
const completion = await new LlamaCompletion({contextSequence: context.getSequence()})
    .generateCompletion(question, {maxTokens: 24, temperature: 0,
                                   onToken: (t) => completionIds.push(...t)});
console.log(JSON.stringify({answer, chatIds, completion, completionIds}));
await context.dispose();
await model.dispose();
await llama.dispose();
