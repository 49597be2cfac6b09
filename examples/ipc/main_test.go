package main

import (
	"bytes"
	"os"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestMain plays the consumer when run re-executes the test binary (what
// os.Executable names under go test) with the socket in its environment.
func TestMain(m *testing.M) {
	if sock, ok := os.LookupEnv(consumerEnv); ok {
		os.Exit(consumerMain(sock))
	}
	os.Exit(m.Run())
}

// TestRun checks that a second process imported the chunk, that its
// checksum is the producer's, that its write shows in the producer's
// mapping, and that the time from export to its first read is printed.
func TestRun(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, run(&out))
	s := out.String()
	t.Log("\n" + s)

	require.Regexp(t, `producer \(pid \d+\): a float32 tensor \[1024 1024\], 4 MiB, in a shareable chunk mapped read-write at 0x[0-9a-f]+\n`, s)
	require.Contains(t, s, "producer (pid "+strconv.Itoa(os.Getpid())+")")
	m := regexp.MustCompile(`consumer \(pid (\d+)\): started from \S+, connected on producer.sock \(mode 0600\); SO_PEERCRED says pid (\d+)\n`).FindStringSubmatch(s)
	require.NotNil(t, m, s)
	require.Equal(t, m[1], m[2], "the kernel names the consumer")
	require.NotEqual(t, strconv.Itoa(os.Getpid()), m[1], "the consumer is another process")
	require.Contains(t, s, "producer: exported the chunk to pid "+m[1]+" alone and sent it as a file descriptor\n")
	require.Regexp(t, `consumer: imported 4 MiB, mapped it read-write at 0x[0-9a-f]+, read the tensor where it lies \(first element -512\), wrote -1 to element \[1023 1023\]\n`, s)

	sums := regexp.MustCompile(`(?m)^(producer|consumer) checksum: (0x[0-9a-f]{16})$`).FindAllStringSubmatch(s, -1)
	require.Len(t, sums, 2, s)
	require.Equal(t, "producer", sums[0][1])
	require.Equal(t, "consumer", sums[1][1])
	require.Equal(t, sums[0][2], sums[1][2], "the consumer read what the producer wrote")

	require.Contains(t, s, "element [1023 1023] in the producer's mapping, after the consumer exited: -1\n")
	require.Contains(t, s, "no bytes copied: both processes map the same memory\n")
	e := regexp.MustCompile(`export to the consumer's first read: (\S+) \(export, send, import, map, grant access, first element read\)\n`).FindStringSubmatch(s)
	require.NotNil(t, e, s)
	d, err := time.ParseDuration(e[1])
	require.NoError(t, err)
	require.Positive(t, d)
}
