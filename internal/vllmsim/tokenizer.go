package vllmsim

import (
	"encoding/json"
	"strings"
)

// Special tokens of the chat template, and the end of sequence.
const (
	imStart = "<|im_start|>"
	imEnd   = "<|im_end|>"
	eos     = "<|endoftext|>"
)

// Token id layout: 0-255 bytes, 256-259 special tokens, then the words.
const (
	idImStart   = 256
	idImEnd     = 257
	idEOS       = 258
	firstWordID = 260
)

var specials = map[string]int{imStart: idImStart, imEnd: idImEnd, eos: idEOS}

// words is the vocabulary the model generates from; each word is a token
// both as is and with a leading space (id + len(words)).
var words = [...]string{
	"the", "model", "answers", "with", "words", "from", "a", "small", "vocabulary", "and",
	"each", "token", "is", "chosen", "by", "hash", "of", "context", "so", "every",
	"run", "repeats", "exactly", "when", "seed", "fixed", "stream", "continues", "after", "migration",
	"worker", "engine", "request", "prompt", "reply", "text", "log", "event", "offset", "delta",
	"river", "stone", "light", "north", "garden", "paper", "window", "quiet", "summer", "silver",
	"cloud", "bridge", "market", "winter", "forest", "harbor", "signal", "orange", "copper", "valley",
	"is", "are", "was", "be", "to", "in", "on", "it", "at", "as",
}

var wordIDs = func() map[string]int {
	m := make(map[string]int, 2*len(words))
	for i, w := range words {
		if _, dup := m[w]; !dup {
			m[w] = firstWordID + i
			m[" "+w] = firstWordID + len(words) + i
		}
	}
	return m
}()

// VocabSize is the number of token ids.
const VocabSize = firstWordID + 2*len(words)

// tokenText is the text of token id (empty for an unknown id).
func tokenText(id int) string {
	switch {
	case id >= 0 && id < 256:
		return string([]byte{byte(id)})
	case id == idImStart:
		return imStart
	case id == idImEnd:
		return imEnd
	case id == idEOS:
		return eos
	case id >= firstWordID && id < firstWordID+len(words):
		return words[id-firstWordID]
	case id >= firstWordID+len(words) && id < VocabSize:
		return " " + words[id-firstWordID-len(words)]
	}
	return ""
}

// Tokenize splits text into token ids: special tokens, vocabulary words (a
// leading space included) and, for anything else, one token per byte.
// Detokenize(Tokenize(s)) == s for every s.
func Tokenize(text string) []int {
	var ids []int
	for len(text) > 0 {
		if text[0] == '<' {
			matched := false
			for s, id := range specials {
				if strings.HasPrefix(text, s) {
					ids = append(ids, id)
					text = text[len(s):]
					matched = true
					break
				}
			}
			if matched {
				continue
			}
		}
		// A piece: an optional space and a run of letters.
		n := 0
		if text[0] == ' ' {
			n = 1
		}
		m := n
		for m < len(text) && isLetter(text[m]) {
			m++
		}
		if m > n {
			if id, ok := wordIDs[text[:m]]; ok {
				ids = append(ids, id)
				text = text[m:]
				continue
			}
		} else {
			m = 1
		}
		for i := 0; i < m; i++ {
			ids = append(ids, int(text[i]))
		}
		text = text[m:]
	}
	return ids
}

func isLetter(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }

// Detokenize is the text of ids. Unknown ids are skipped; ok is false if
// there were any.
func Detokenize(ids []int) (text string, ok bool) {
	var b strings.Builder
	ok = true
	for _, id := range ids {
		t := tokenText(id)
		if t == "" {
			ok = false
			continue
		}
		b.WriteString(t)
	}
	return b.String(), ok
}

// ChatMessage is a message of a chat request as the template reads it.
type ChatMessage struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content"`
	Name       string          `json:"name,omitempty"`
	ToolCalls  json.RawMessage `json:"tool_calls,omitempty"`
	ToolCallID string          `json:"tool_call_id,omitempty"`
}

// contentText is a message's content: a string, null, or text parts joined.
func contentText(raw json.RawMessage) (string, bool) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", true
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, true
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if json.Unmarshal(raw, &parts) != nil {
		return "", false
	}
	var b strings.Builder
	for _, p := range parts {
		if p.Type != "text" {
			return "", false
		}
		b.WriteString(p.Text)
	}
	return b.String(), true
}

// ApplyChatTemplate renders messages with the ChatML template: a tools
// section when tools are given, then <|im_start|>role\ncontent<|im_end|>\n
// per message. With continueFinal the last message is left open (no
// <|im_end|>), so the model continues it; with addGenerationPrompt an
// assistant turn is opened. As in vLLM, both at once is an error, and so is
// continueFinal when the last message is not the assistant's.
func ApplyChatTemplate(msgs []ChatMessage, tools json.RawMessage, addGenerationPrompt, continueFinal bool) (string, error) {
	if addGenerationPrompt && continueFinal {
		return "", errorf(400, "BadRequestError", "Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
	}
	if len(msgs) == 0 {
		return "", errorf(400, "BadRequestError", "messages must not be empty")
	}
	if continueFinal && msgs[len(msgs)-1].Role != "assistant" {
		return "", errorf(400, "BadRequestError", "continue_final_message requires the final message to be from the assistant")
	}
	var b strings.Builder
	if len(tools) > 0 && string(tools) != "null" {
		b.WriteString(imStart + "system\n# Tools\n")
		b.Write(tools)
		b.WriteString(imEnd + "\n")
	}
	for i, m := range msgs {
		text, ok := contentText(m.Content)
		if !ok {
			return "", errorf(400, "BadRequestError", "messages[%d].content: only text content is supported", i)
		}
		b.WriteString(imStart + m.Role + "\n")
		b.WriteString(text)
		if len(m.ToolCalls) > 0 && string(m.ToolCalls) != "null" {
			b.WriteString("<tool_call>")
			b.Write(m.ToolCalls)
			b.WriteString("</tool_call>")
		}
		if continueFinal && i == len(msgs)-1 {
			break
		}
		b.WriteString(imEnd + "\n")
	}
	if addGenerationPrompt {
		b.WriteString(imStart + "assistant\n")
	}
	return b.String(), nil
}
