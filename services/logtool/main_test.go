package logtool

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a goroutine behind: Tail's
// readers end with its ctx.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
