package netproxy

import (
	"bufio"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestProxy: the proxy delays what it forwards each way, Cut drops its
// connections and refuses new ones, Heal serves again, Close ends it.
func TestProxy(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	echoed := make(chan struct{})
	go func() {
		defer close(echoed)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); <-echoed })
	p, err := Start("127.0.0.1:0", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	echo := func() (time.Duration, error) {
		c, err := net.DialTimeout("tcp", p.Addr(), time.Second)
		if err != nil {
			return 0, err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		start := time.Now()
		if _, err := c.Write([]byte("ping\n")); err != nil {
			return 0, err
		}
		if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
			return 0, err
		}
		return time.Since(start), nil
	}
	const delay = 30 * time.Millisecond
	for _, tc := range []struct {
		name                 string
		toTarget, fromTarget time.Duration
	}{
		{"both ways", delay, delay},
		{"to the target only", 2 * delay, 0},
		{"back only", 0, 2 * delay},
	} {
		p.SetDelays(tc.toTarget, tc.fromTarget)
		if took, err := echo(); err != nil || took < tc.toTarget+tc.fromTarget {
			t.Fatalf("%s: echo %v, %v; want at least %v", tc.name, took, err, tc.toTarget+tc.fromTarget)
		}
	}
	p.Cut()
	if _, err := echo(); err == nil {
		t.Error("an echo went through a cut link")
	}
	if err := p.Heal(); err != nil {
		t.Fatal(err)
	}
	if _, err := echo(); err != nil {
		t.Errorf("echo once healed: %v", err)
	}
}
