// Command nmeter is a small stand-in for busybox's nmeter applet in the conformance test images:
// the node tests read the time with milliseconds as `nmeter -d0 '%3t' | head -n1`, and the test
// bed's busybox (Debian's) has no nmeter. It understands only what those tests use: -d MSEC
// between lines, and a format whose %t (with an optional digit count before it, default 0) is
// the local time of day as HH:MM:SS[.fff]. It prints a line per period until its output closes.
package main

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

func main() {
	delay, format := time.Second, ""
	for i := 1; i < len(os.Args); i++ {
		a := os.Args[i]
		switch {
		case a == "-d" && i+1 < len(os.Args):
			i++
			a = "-d" + os.Args[i]
			fallthrough
		case strings.HasPrefix(a, "-d"):
			ms, err := strconv.Atoi(strings.TrimPrefix(a, "-d"))
			if err != nil || ms < 0 {
				fmt.Fprintln(os.Stderr, "nmeter: bad -d value")
				os.Exit(2)
			}
			delay = time.Duration(ms) * time.Millisecond
		default:
			format = a
		}
	}
	out := bufio.NewWriter(os.Stdout)
	for {
		fmt.Fprintln(out, expand(format, time.Now()))
		if out.Flush() != nil {
			return
		}
		time.Sleep(delay)
	}
}

// expand replaces each %[N]t of format with the time of day, N fractional digits (at most 6).
func expand(format string, now time.Time) string {
	var b strings.Builder
	for i := 0; i < len(format); i++ {
		if format[i] != '%' || i+1 >= len(format) {
			b.WriteByte(format[i])
			continue
		}
		digits, j := 0, i+1
		if d := format[j]; d >= '0' && d <= '9' && j+1 < len(format) {
			digits, j = min(int(d-'0'), 6), j+1
		}
		if format[j] != 't' {
			b.WriteByte(format[i])
			continue
		}
		layout := "15:04:05"
		if digits > 0 {
			layout += "." + strings.Repeat("0", digits)
		}
		b.WriteString(now.Format(layout))
		i = j
	}
	return b.String()
}
