package regions

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a test leaves a goroutine behind: a
// sync loop, a renewal or a store client that was not closed.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
