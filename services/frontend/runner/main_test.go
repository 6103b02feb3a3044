package runner

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a goroutine behind: followers,
// runners and watchers must all end with their owner.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
