// Command nc is a small stand-in for netcat in the conformance test images: upstream's agnhost
// image has netcat-openbsd, whose UDP mode the node tests use (`echo hostName | nc -w 1 -u IP
// PORT`); the test bed's busybox nc has no UDP. It sends its standard input to HOST:PORT over
// TCP, or as one datagram with -u, and prints what comes back until the peer closes or -w
// seconds pass without data.
package main

import (
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"time"
)

func main() {
	udp, wait, args := false, 2*time.Second, []string{}
	for i := 1; i < len(os.Args); i++ {
		switch a := os.Args[i]; a {
		case "-u":
			udp = true
		case "-w":
			i++
			if i < len(os.Args) {
				if s, err := strconv.Atoi(os.Args[i]); err == nil {
					wait = time.Duration(s) * time.Second
				}
			}
		case "-v", "-n", "-N", "-q":
		default:
			args = append(args, a)
		}
	}
	if len(args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: nc [-u] [-w SECONDS] HOST PORT")
		os.Exit(2)
	}
	network := "tcp"
	if udp {
		network = "udp"
	}
	conn, err := net.DialTimeout(network, net.JoinHostPort(args[0], args[1]), wait)
	if err != nil {
		fmt.Fprintln(os.Stderr, "nc:", err)
		os.Exit(1)
	}
	defer conn.Close()
	input, err := io.ReadAll(os.Stdin)
	if err == nil && len(input) > 0 {
		_, err = conn.Write(input)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "nc:", err)
		os.Exit(1)
	}
	buf := make([]byte, 64*1024)
	for {
		_ = conn.SetReadDeadline(time.Now().Add(wait))
		n, err := conn.Read(buf)
		os.Stdout.Write(buf[:n])
		if err != nil {
			return
		}
	}
}
