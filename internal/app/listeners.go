package app

import (
	"fmt"
	"net"
	"strings"

	"github.com/slidingwindow/ratelimit/internal/settings"
)

// listeners are the service's listeners: gRPC and HTTP always; admin,
// debug and metrics when their address is set, nil otherwise.
type listeners struct {
	GRPC, HTTP, Admin, Debug, Metrics net.Listener
}

// listen opens the listeners. On an error, those already open are closed.
func listen(s *settings.Settings) (*listeners, error) {
	l := &listeners{}
	for _, p := range []struct {
		ln         *net.Listener
		addr, flag string
		optional   bool
	}{
		{&l.GRPC, s.GRPCAddr, settings.FlagGRPCAddr, false},
		{&l.HTTP, s.HTTPAddr, settings.FlagHTTPAddr, false},
		{&l.Admin, s.AdminAddr, settings.FlagAdminAddr, true},
		{&l.Debug, s.DebugAddr, settings.FlagDebugAddr, true},
		{&l.Metrics, s.MetricsAddr, settings.FlagMetricsAddr, true},
	} {
		if p.optional && p.addr == "" {
			continue
		}
		network, addr := "tcp", p.addr
		if path, ok := strings.CutPrefix(addr, "unix:"); ok && p.ln == &l.GRPC {
			network, addr = "unix", path
		}
		ln, err := net.Listen(network, addr)
		if err != nil {
			l.close()
			return nil, fmt.Errorf("--%s: %w", p.flag, err)
		}
		*p.ln = ln
	}
	return l, nil
}

// close closes the listeners that are open: those no server took over.
func (l *listeners) close() {
	for _, ln := range []net.Listener{l.GRPC, l.HTTP, l.Admin, l.Debug, l.Metrics} {
		if ln != nil {
			_ = ln.Close() // never served: a close that fails leaves nothing to undo
		}
	}
}
