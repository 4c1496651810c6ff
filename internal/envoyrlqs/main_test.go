package envoyrlqs

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a test leaves a goroutine behind: a
// client, stream or server that was not closed.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
