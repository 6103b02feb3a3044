package openai

import (
	"testing"

	"github.com/baton-dev/baton/events"
)

// TestResponsePromptIsChats: the same question asked through chat and
// through the Responses API has the same prompt text, so the mock engine
// gives it the same answer.
func TestResponsePromptIsChats(t *testing.T) {
	items := []InputItem{{Type: "message", Role: "user", Text: "hello there"}, {Type: "message", Role: "developer", Text: "be brief"}}
	msgs := []events.Message{{Role: "user", Content: "hello there"}, {Role: "system", Content: "be brief"}}
	if got, want := PromptText(items), renderChat(msgs); got != want {
		t.Errorf("got prompt %q, want chat's %q", got, want)
	}
}
