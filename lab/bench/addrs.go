package bench

import (
	"fmt"
	"net"
	"strconv"
)

// freePort asks the kernel for a free loopback TCP port. Another process
// could take it before we bind it, which the readiness checks then report.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("free tcp port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func freeAddr() (string, error) {
	p, err := freePort()
	if err != nil {
		return "", err
	}
	return "127.0.0.1:" + strconv.Itoa(p), nil
}

// turnoutAddrs picks one turnout's listen address and its feedback
// syslog address: feedback is on by default, and two turnouts on the
// default address would not both start.
func turnoutAddrs() (listen, syslog string, err error) {
	if listen, err = freeAddr(); err != nil {
		return "", "", err
	}
	p, err := freeFeedbackPort()
	if err != nil {
		return "", "", err
	}
	return listen, "127.0.0.1:" + strconv.Itoa(p), nil
}

// freeFeedbackPort is a loopback port free on UDP and on TCP at once:
// turnout takes the feedback address on UDP, and on TCP too with
// haproxy.feedback: ring, where a UDP-only pick could land on a port a
// TCP socket (another process's, or an outgoing connection's) holds.
func freeFeedbackPort() (int, error) {
	var last error
	for range 20 {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("free udp port: %w", err)
		}
		p := pc.LocalAddr().(*net.UDPAddr).Port
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		_ = pc.Close()
		if err != nil {
			last = err
			continue
		}
		_ = ln.Close()
		return p, nil
	}
	return 0, fmt.Errorf("no loopback port free on both udp and tcp: %w", last)
}
