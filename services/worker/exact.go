package worker

import (
	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/services/engine"
)

// continuation is how a job's engine continues its dispatch: "" for a
// first attempt (nothing to continue), engine.ContinueTokenIDs for a
// continuation that is exact by construction (token ids, or an engine that
// is not an engine.Continuer: the mock), engine.ContinuePrefill otherwise.
func continuation(eng engine.Engine, d events.Dispatch) string {
	if d.StartOffset == 0 {
		return ""
	}
	if c, ok := eng.(engine.Continuer); ok {
		return c.ContinuesWith(d)
	}
	return engine.ContinueTokenIDs
}

// exactAtStart is the verdict a continuation's first delta carries: true
// when it is exact by construction, nil while only the engine's usage can
// tell (prefill) and on a first attempt.
func exactAtStart(mode string) *bool {
	if mode != engine.ContinueTokenIDs {
		return nil
	}
	return verdict(true)
}

// exactAtEnd is the verdict a continuation's completion carries (nil on a
// first attempt). Token ids (or an engine exact by construction): exact.
// Prefill: exact only when the engine shows it took the text so far token
// for token: its own prompt_tokens for the continuation equal the original
// prompt's, as an earlier attempt's engine counted them (the chat
// template's own tokens included: the generation prompt of the first turn
// is the start of the prefilled assistant message), plus the tokens so
// far. Without either count, approximate. The rule can miss both ways: a
// re-tokenization into as many tokens as were generated, but other ones,
// passes; a template that renders a continued message with other tokens
// than a generation prompt (a space, a BOS) fails an exact continuation.
func exactAtEnd(mode string, d events.Dispatch, res engine.Result) *bool {
	switch mode {
	case "":
		return nil
	case engine.ContinueTokenIDs:
		return verdict(true)
	}
	return verdict(d.EnginePromptTokens > 0 && res.PromptTokens > 0 && res.PromptTokens == d.EnginePromptTokens+d.StartOffset)
}

func verdict(exact bool) *bool { return &exact }
