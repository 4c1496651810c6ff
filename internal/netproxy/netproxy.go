// Package netproxy is a TCP proxy that delays what it forwards and can cut
// and heal its link: a slow or partitioned network between the service
// and a store, for the tests and the bench (cmd/ratelimit-bench's regions
// runs). What it forwards it forwards whole and in order, each chunk held
// for the delay in force when it was read.
package netproxy

import (
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy forwards the connections it accepts to a target.
type Proxy struct {
	addr, target         string
	toTarget, fromTarget atomic.Int64 // delays, in nanoseconds

	mu     sync.Mutex
	ln     net.Listener
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// Start listens on addr (host:port; port 0 picks a free one) and forwards
// each connection it accepts to target, without delay until told.
func Start(addr, target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	p := &Proxy{addr: ln.Addr().String(), target: target, conns: map[net.Conn]struct{}{}}
	p.serve(ln)
	return p, nil
}

// Addr is the address the proxy listens on.
func (p *Proxy) Addr() string { return p.addr }

// SetDelay holds what goes either way d from when it was read.
func (p *Proxy) SetDelay(d time.Duration) { p.SetDelays(d, d) }

// SetDelays holds what goes to the target toTarget, and what comes back
// fromTarget, from when it was read.
func (p *Proxy) SetDelays(toTarget, fromTarget time.Duration) {
	p.toTarget.Store(int64(toTarget))
	p.fromTarget.Store(int64(fromTarget))
}

// Cut stops listening and drops every connection, as a partition or a
// killed process would; Heal listens again.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cutLocked()
}

func (p *Proxy) cutLocked() {
	if p.ln != nil {
		_ = p.ln.Close() // closing is the point
		p.ln = nil
	}
	for c := range p.conns {
		_ = c.Close()
		delete(p.conns, c)
	}
}

// Heal listens again on the same address after Cut.
func (p *Proxy) Heal() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.ln != nil {
		return nil
	}
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		return err
	}
	p.serveLocked(ln)
	return nil
}

// Close cuts the link for good and waits for the proxy's goroutines.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	p.cutLocked()
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *Proxy) serve(ln net.Listener) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.serveLocked(ln)
}

func (p *Proxy) serveLocked(ln net.Listener) {
	p.ln = ln
	p.wg.Go(func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", p.target)
			if err != nil {
				_ = client.Close() // the target is down: so is the link
				continue
			}
			if !p.track(client, server) {
				continue // cut or closed: the next Accept fails
			}
			p.wg.Go(func() { p.forward(server, client, &p.toTarget) })
			p.wg.Go(func() { p.forward(client, server, &p.fromTarget) })
		}
	})
}

// track records a connection pair, or closes it when the link is cut or
// closed, and reports which.
func (p *Proxy) track(conns ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.ln == nil {
		for _, c := range conns {
			_ = c.Close()
		}
		return false
	}
	for _, c := range conns {
		p.conns[c] = struct{}{}
	}
	return true
}

// forward copies src to dst, each chunk held delay from when it was read.
func (p *Proxy) forward(dst, src net.Conn, delay *atomic.Int64) {
	type chunk struct {
		data []byte
		due  time.Time
	}
	chunks := make(chan chunk, 1024)
	go func() {
		defer close(chunks)
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				chunks <- chunk{slices.Clone(buf[:n]), time.Now().Add(time.Duration(delay.Load()))}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range chunks {
		time.Sleep(time.Until(c.due))
		if _, err := dst.Write(c.data); err != nil {
			break
		}
	}
	// Either side closing ends both: that is how a proxied connection ends.
	_ = src.Close()
	_ = dst.Close()
	for range chunks {
	}
}
