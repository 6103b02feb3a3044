// Package tinygguf writes a tiny llama-architecture GGUF model with random
// weights, for tests that run a real inference server (Ollama, llama.cpp's
// llama-server) without downloading a model: a byte-level BPE vocabulary
// (256 byte tokens, a few merges, ChatML's special tokens), 2 layers, an
// embedding of 128, F32 tensors. Its answers are nonsense, but they are a
// deterministic function of the weights (Config.Seed) and the prompt, so
// greedy decoding repeats exactly.
//
// The format is GGUF version 3 (ggml's docs/gguf.md): a header, the
// metadata key-value pairs, the tensor infos, then the tensor data, each
// tensor aligned to 32 bytes.
package tinygguf

import (
	"bufio"
	"cmp"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"strings"
)

// Config shapes the model; zero values mean the defaults.
type Config struct {
	Seed    uint64 // weights' seed (default 1)
	Layers  int    // default 2
	Embed   int    // default 128
	Heads   int    // default 4
	FF      int    // feed-forward width, default 256
	Context int    // default 512
}

func (c Config) withDefaults() Config {
	c.Seed = cmp.Or(c.Seed, 1)
	c.Layers = cmp.Or(c.Layers, 2)
	c.Embed = cmp.Or(c.Embed, 128)
	c.Heads = cmp.Or(c.Heads, 4)
	c.FF = cmp.Or(c.FF, 256)
	c.Context = cmp.Or(c.Context, 512)
	return c
}

// Special tokens, after the byte tokens and the merges.
const (
	ImStart   = "<|im_start|>"
	ImEnd     = "<|im_end|>"
	EndOfText = "<|endoftext|>"
)

// ChatTemplate is the model's chat template (ChatML), as Jinja.
const ChatTemplate = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"

// byteToken is GPT-2's byte-level BPE mapping of byte b to a printable rune.
func byteToken(b int) string {
	switch {
	case b >= '!' && b <= '~', b >= 0xA1 && b <= 0xAC, b >= 0xAE && b <= 0xFF:
		return string(rune(b))
	}
	n := 0
	for x := range b {
		if !(x >= '!' && x <= '~' || x >= 0xA1 && x <= 0xAC || x >= 0xAE && x <= 0xFF) {
			n++
		}
	}
	return string(rune(256 + n))
}

// vocab returns the tokens, their types (1 normal, 3 control) and the merges.
func vocab() (tokens []string, types []int32, merges []string) {
	for b := range 256 {
		tokens = append(tokens, byteToken(b))
		types = append(types, 1)
	}
	space := byteToken(' ')
	for c := 'a'; c <= 'z'; c++ {
		merges = append(merges, space+" "+string(c))
		tokens = append(tokens, space+string(c))
		types = append(types, 1)
	}
	for _, s := range []string{ImStart, ImEnd, EndOfText} {
		tokens = append(tokens, s)
		types = append(types, 3)
	}
	return tokens, types, merges
}

// printable reports whether token is printable ASCII text (or a space and
// a letter): the only tokens the model tends to say.
func printable(token string) bool {
	space := byteToken(' ')
	if rest, ok := strings.CutPrefix(token, space); ok {
		return len(rest) <= 1
	}
	return len(token) == 1 && token[0] >= '!' && token[0] <= '~'
}

// Write writes the model to w.
func Write(w io.Writer, cfg Config) error {
	c := cfg.withDefaults()
	tokens, types, merges := vocab()
	kv := metadata(c, tokens, types, merges)
	ts := tensors(c, len(tokens))
	e := uint64(c.Embed)

	bw := bufio.NewWriter(w)
	out := &writer{w: bw}
	out.raw([]byte("GGUF"))
	out.u32(3)
	out.u64(uint64(len(ts)))
	out.u64(uint64(kv.n))
	out.raw(kv.buf)
	var off uint64
	sizes := make([]uint64, len(ts))
	for i, t := range ts {
		out.str(t.name)
		out.u32(uint32(len(t.dims)))
		n := uint64(1)
		for _, d := range t.dims {
			out.u64(d)
			n *= d
		}
		out.u32(0) // GGML_TYPE_F32
		out.u64(off)
		sizes[i] = n * 4
		off = align(off + sizes[i])
	}
	out.pad()
	rng := rand.New(rand.NewPCG(c.Seed, c.Seed^0x9e3779b97f4a7c15))
	var b [4]byte
	for i, t := range ts {
		for k := range sizes[i] / 4 {
			v := float32(1)
			if !t.norm {
				v = float32(rng.NormFloat64() * 0.5)
			}
			if t.name == "output.weight" && !printable(tokens[k/e]) {
				v = 0 // a logit of 0: printable text wins, so answers are readable
			}
			binary.LittleEndian.PutUint32(b[:], math.Float32bits(v))
			out.raw(b[:])
		}
		out.pad()
	}
	if out.err != nil {
		return out.err
	}
	return bw.Flush()
}

// metadata is the model's key-value section: a llama of c with a GPT-2
// tokenizer of tokens.
func metadata(c Config, tokens []string, types []int32, merges []string) *kvs {
	nv := len(tokens)
	kv := &kvs{}
	kv.str("general.architecture", "llama")
	kv.str("general.name", "tiny")
	kv.u32("general.alignment", alignment)
	kv.u32("llama.context_length", uint32(c.Context))
	kv.u32("llama.embedding_length", uint32(c.Embed))
	kv.u32("llama.block_count", uint32(c.Layers))
	kv.u32("llama.feed_forward_length", uint32(c.FF))
	kv.u32("llama.attention.head_count", uint32(c.Heads))
	kv.u32("llama.attention.head_count_kv", uint32(c.Heads))
	kv.u32("llama.rope.dimension_count", uint32(c.Embed/c.Heads))
	kv.f32("llama.attention.layer_norm_rms_epsilon", 1e-5)
	kv.u32("llama.vocab_size", uint32(nv))
	kv.str("tokenizer.ggml.model", "gpt2")
	kv.str("tokenizer.ggml.pre", "default")
	kv.strs("tokenizer.ggml.tokens", tokens)
	kv.i32s("tokenizer.ggml.token_type", types)
	kv.strs("tokenizer.ggml.merges", merges)
	kv.u32("tokenizer.ggml.bos_token_id", uint32(nv-1))
	kv.u32("tokenizer.ggml.eos_token_id", uint32(nv-2))
	kv.u32("tokenizer.ggml.padding_token_id", uint32(nv-1))
	kv.boolean("tokenizer.ggml.add_bos_token", false)
	kv.str("tokenizer.chat_template", ChatTemplate)
	return kv
}

// tensor is one of the model's tensors, of float32.
type tensor struct {
	name string
	dims []uint64
	norm bool // filled with ones
}

// tensors are the model's tensors, in the file's order, for a vocabulary
// of nv tokens.
func tensors(c Config, nv int) []tensor {
	e, f := uint64(c.Embed), uint64(c.FF)
	ts := []tensor{{"token_embd.weight", []uint64{e, uint64(nv)}, false}}
	for i := range c.Layers {
		p := fmt.Sprintf("blk.%d.", i)
		ts = append(ts,
			tensor{p + "attn_norm.weight", []uint64{e}, true},
			tensor{p + "attn_q.weight", []uint64{e, e}, false},
			tensor{p + "attn_k.weight", []uint64{e, e}, false},
			tensor{p + "attn_v.weight", []uint64{e, e}, false},
			tensor{p + "attn_output.weight", []uint64{e, e}, false},
			tensor{p + "ffn_norm.weight", []uint64{e}, true},
			tensor{p + "ffn_gate.weight", []uint64{e, f}, false},
			tensor{p + "ffn_up.weight", []uint64{e, f}, false},
			tensor{p + "ffn_down.weight", []uint64{f, e}, false},
		)
	}
	ts = append(ts, tensor{"output_norm.weight", []uint64{e}, true}, tensor{"output.weight", []uint64{e, uint64(nv)}, false})
	return ts
}

const alignment = 32

func align(n uint64) uint64 { return (n + alignment - 1) / alignment * alignment }

// writer writes GGUF's little-endian values, keeping the first error.
type writer struct {
	w   io.Writer
	n   uint64
	err error
}

func (w *writer) raw(b []byte) {
	if w.err == nil {
		_, w.err = w.w.Write(b)
		w.n += uint64(len(b))
	}
}

func (w *writer) u32(v uint32) { w.raw(binary.LittleEndian.AppendUint32(nil, v)) }
func (w *writer) u64(v uint64) { w.raw(binary.LittleEndian.AppendUint64(nil, v)) }
func (w *writer) str(s string) { w.u64(uint64(len(s))); w.raw([]byte(s)) }
func (w *writer) pad() {
	if r := align(w.n) - w.n; r > 0 {
		w.raw(make([]byte, r))
	}
}

// kvs builds the metadata section.
type kvs struct {
	buf []byte
	n   int
}

// GGUF metadata value types.
const (
	typeUint32  = 4
	typeInt32   = 5
	typeFloat32 = 6
	typeBool    = 7
	typeString  = 8
	typeArray   = 9
)

func (k *kvs) key(name string, typ uint32) {
	k.n++
	k.buf = binary.LittleEndian.AppendUint64(k.buf, uint64(len(name)))
	k.buf = append(k.buf, name...)
	k.buf = binary.LittleEndian.AppendUint32(k.buf, typ)
}

func (k *kvs) rawStr(s string) {
	k.buf = binary.LittleEndian.AppendUint64(k.buf, uint64(len(s)))
	k.buf = append(k.buf, s...)
}

func (k *kvs) str(name, v string) { k.key(name, typeString); k.rawStr(v) }
func (k *kvs) u32(name string, v uint32) {
	k.key(name, typeUint32)
	k.buf = binary.LittleEndian.AppendUint32(k.buf, v)
}
func (k *kvs) f32(name string, v float32) {
	k.key(name, typeFloat32)
	k.buf = binary.LittleEndian.AppendUint32(k.buf, math.Float32bits(v))
}
func (k *kvs) boolean(name string, v bool) {
	k.key(name, typeBool)
	b := byte(0)
	if v {
		b = 1
	}
	k.buf = append(k.buf, b)
}
func (k *kvs) strs(name string, vs []string) {
	k.key(name, typeArray)
	k.buf = binary.LittleEndian.AppendUint32(k.buf, typeString)
	k.buf = binary.LittleEndian.AppendUint64(k.buf, uint64(len(vs)))
	for _, v := range vs {
		k.rawStr(v)
	}
}
func (k *kvs) i32s(name string, vs []int32) {
	k.key(name, typeArray)
	k.buf = binary.LittleEndian.AppendUint32(k.buf, typeInt32)
	k.buf = binary.LittleEndian.AppendUint64(k.buf, uint64(len(vs)))
	for _, v := range vs {
		k.buf = binary.LittleEndian.AppendUint32(k.buf, uint32(v))
	}
}
