// llama.cpp on a GGUF through node-llama-cpp's prebuilt libllama (npm), for benchmarks/cpu_scale.py.
//
//   node benchmarks/llamacpp_node_peer.mjs MODEL.gguf THREADS GEN NODE_MODULES_PARENT
//
// Measures what cpu_scale.py's child measures for the engine: one request's decode at 128 and 2,048 tokens of
// context (tokens after the first over their time), pp512, a batch of 8 sequences in one context against one of
// them alone, and the peak RSS. Each rate is given by wall time and by this process's CPU time (user + system, all
// threads: steadier on a shared box). Which CPU variant of ggml runs is chosen by the node_modules: ggml loads
// the one libggml-cpu-*.so left in the node_modules it is given (cpu_scale.py makes such copies).
import {pathToFileURL} from "node:url";
import path from "node:path";

const [modelPath, threadsArg, genArg, modulesParent] = process.argv.slice(2);
const threads = Number(threadsArg || 2), gen = Number(genArg || 64);
const {getLlama, LlamaLogLevel} = await import(
    pathToFileURL(path.join(modulesParent, "node_modules", "node-llama-cpp", "dist", "index.js")).href);
let seed = 1;
const ids = (n) => Array.from({length: n}, () => 1000 + ((seed = (seed * 1103515245 + 12345) % 2147483648) % 39000));
const cpu = () => { const u = process.cpuUsage(); return (u.user + u.system) / 1e6; };
const now = () => performance.now() / 1000;

const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error});
const model = await llama.loadModel({modelPath, gpuLayers: 0});
const out = {};

async function decodeRate(ctx) {
    const context = await model.createContext({contextSize: ctx + gen + 64, batchSize: 512, threads, sequences: 1});
    const seq = context.getSequence();
    await seq.evaluateWithoutGeneratingNewTokens(ids(ctx));
    let n = 0, t0 = 0, c0 = 0;
    for await (const tok of seq.evaluate(ids(1), {temperature: 0})) {
        if (n === 0) { t0 = now(); c0 = cpu(); }
        if (++n >= gen) break;
    }
    const rate = [(n - 1) / (now() - t0), (n - 1) / (cpu() - c0)];
    await context.dispose();
    return rate;
}

await decodeRate(32);  // warm-up
[out.decode128_tok_s, out.decode128_tok_cpu_s] = await decodeRate(128);
[out.decode2048_tok_s, out.decode2048_tok_cpu_s] = await decodeRate(2048);
{
    const context = await model.createContext({contextSize: 1024, batchSize: 512, threads, sequences: 1});
    const seq = context.getSequence();
    await seq.evaluateWithoutGeneratingNewTokens(ids(64));  // warm-up
    await seq.clearHistory();
    const t = now(), c = cpu();
    await seq.evaluateWithoutGeneratingNewTokens(ids(512));
    [out.pp512_tok_s, out.pp512_tok_cpu_s] = [512 / (now() - t), 512 / (cpu() - c)];
    await context.dispose();
}
{
    const context = await model.createContext({contextSize: 8 * (128 + gen + 16), batchSize: 512, threads, sequences: 8});
    const run = async (seq) => {
        let n = 0;
        for await (const tok of seq.evaluate(ids(128), {temperature: 0})) if (++n >= gen) break;
        return n;
    };
    let t = now(), c = cpu();
    const s0 = context.getSequence();
    await run(s0);
    const single = [gen / (now() - t), gen / (cpu() - c)];
    s0.dispose();
    const seqs = Array.from({length: 8}, () => context.getSequence());
    t = now(); c = cpu();
    const n = (await Promise.all(seqs.map(run))).reduce((a, b) => a + b, 0);
    [out.batch8_tok_s, out.batch8_tok_cpu_s] = [n / (now() - t), n / (cpu() - c)];
    [out.single_tok_s, out.single_tok_cpu_s] = single;
    out.batch8_ratio = out.batch8_tok_s / single[0];
    out.batch8_ratio_cpu = out.batch8_tok_cpu_s / single[1];
    await context.dispose();
}
out.peak_rss = process.resourceUsage().maxRSS * 1024;
console.log("RESULT " + JSON.stringify(out));
process.exit(0);
