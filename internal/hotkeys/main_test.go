package hotkeys

import (
	"testing"
	"time"

	"go.uber.org/goleak"
)

// epoch is the tests' first instant: a multiple of 60 s.
var epoch = time.Unix(1_700_006_400, 0)

// TestMain fails the package when a test leaves a goroutine behind: a
// client, server, watcher or ticker that was not closed.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
