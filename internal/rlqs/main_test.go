package rlqs

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a test leaves a goroutine behind: a
// client, server, watcher or ticker that was not closed.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
