package frontend

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a goroutine behind: handlers,
// consoles and the runtime a frontend starts must all end with its Run.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
