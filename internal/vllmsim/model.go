package vllmsim

import (
	"encoding/binary"
	"hash/fnv"
	"math"
	"math/rand/v2"
)

// candidates is how many tokens the model considers at each position; the
// top_logprobs a request may ask for are capped by it.
const candidates = 5

// sampling is a request's sampling parameters.
type sampling struct {
	temperature float64 // 0: greedy
	seed        *int64
	rng         *rand.Rand // unseeded sampling at temperature > 0
}

// step is one generated token.
type step struct {
	id      int
	logprob float64
	top     []alt // the candidates, best first
}

type alt struct {
	id      int
	logprob float64
}

// contextHash is a rolling hash of a token sequence: the model's state.
type contextHash uint64

func newContext(ids []int) contextHash {
	h := contextHash(14695981039346656037)
	for _, id := range ids {
		h = h.add(id)
	}
	return h
}

func (h contextHash) add(id int) contextHash {
	x := uint64(h) ^ uint64(id)
	x *= 1099511628211
	x ^= x >> 29
	return contextHash(x)
}

// next is the model's token after context h: a pure function of h, and of
// the seed when sampling at temperature > 0.
func (s sampling) next(h contextHash) step {
	var top [candidates]alt
	logits := [candidates]float64{}
	x := uint64(h)
	for j := range candidates {
		x = splitmix(x)
		top[j].id = firstWordID + len(words) + int(x%uint64(len(words))) // " word" tokens
		logits[j] = -0.6*float64(j) - float64(x>>54)/4096
	}
	lse := logSumExp(logits[:], 1)
	for j := range top {
		top[j].logprob = logits[j] - lse
	}
	pick := 0
	if s.temperature > 0 {
		var u float64
		if s.seed != nil {
			var b [16]byte
			binary.LittleEndian.PutUint64(b[:8], uint64(h))
			binary.LittleEndian.PutUint64(b[8:], uint64(*s.seed))
			f := fnv.New64a()
			_, _ = f.Write(b[:])
			u = float64(splitmix(f.Sum64())>>11) / (1 << 53)
		} else {
			u = s.rng.Float64()
		}
		lt := logSumExp(logits[:], s.temperature)
		acc := 0.0
		for j := range candidates {
			acc += math.Exp(logits[j]/s.temperature - lt)
			if u < acc {
				pick = j
				break
			}
			pick = j
		}
	}
	return step{id: top[pick].id, logprob: top[pick].logprob, top: top[:]}
}

func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

func logSumExp(l []float64, t float64) float64 {
	m := math.Inf(-1)
	for _, v := range l {
		m = max(m, v/t)
	}
	s := 0.0
	for _, v := range l {
		s += math.Exp(v/t - m)
	}
	return m + math.Log(s)
}

// GreedyCompletion is the simulator's answer on /v1/completions to prompt at
// temperature 0 (or with --greedy and no temperature), maxTokens long with
// no stop strings: what a fault-free run returns, for checks such as the
// chaos soak's.
func GreedyCompletion(prompt string, maxTokens int) string {
	d := newDecoder(&generation{prompt: Tokenize(prompt), maxTokens: maxTokens})
	for {
		_, finish := d.next()
		if finish != "" {
			return d.text.String()
		}
	}
}
