package serving

// Request traces: the LLM serving requests a KV cache replays, as two
// public traces record them. Both readers return the same Request, hold
// every trace to the same rules (Request's invariants), and refuse what
// breaks them with an ErrMalformed error that names the line.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"math"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/isnil"
)

// Bounds on what a request trace may say. Each refuses only values no
// real trace has (the largest prompt in the Azure and Mooncake traces is
// 191,378 tokens, the longest line 2,698 bytes, the longest trace an
// hour), so that a corrupt file is an error and never an allocation of
// its own making.
const (
	// MaxTokens bounds a request's prompt and its output, in tokens.
	MaxTokens = 1 << 24
	// MaxRequestLineBytes bounds a line of a request trace, not counting
	// its line ending: room for MaxTokens/BlockTokens hash ids of 20
	// characters each, as the Mooncake trace writes them.
	MaxRequestLineBytes = 1 << 20
	// MaxArrival bounds a request's arrival after the trace's first.
	MaxArrival = 365 * 24 * time.Hour
	// MaxN bounds a request's parallel samples (Request.N), as vLLM's
	// SamplingParams.n: far more than any serving workload asks for.
	MaxN = 256
	// MaxSampledSequences bounds, in one simulation, the sequences that
	// requests of several samples add beyond one each (Simulate builds one
	// SimRequest a sequence).
	MaxSampledSequences = 1 << 22
)

// BlockTokens is the number of prompt tokens a Mooncake hash id names: a
// prompt of n tokens is ceil(n/BlockTokens) blocks, the last one partial.
const BlockTokens = 512

// Request is one request of an LLM serving trace: a prompt of Input tokens
// that arrives at Arrival and generates Output tokens.
//
// In a trace the readers return, Arrival starts at 0 (the first request)
// and never decreases, Arrival <= MaxArrival, and 0 <= Input, Output <=
// MaxTokens.
type Request struct {
	// Arrival is the time since the trace's first request arrived.
	Arrival time.Duration
	// Input is the prompt's length in tokens (context tokens).
	Input int
	// Output is the number of tokens the request generated.
	Output int
	// Blocks names the prompt's blocks of BlockTokens tokens (the field,
	// or the constant where the field is 0), first to last, when the trace
	// names them (Mooncake's and a Bailian trace's hash_ids; nil for an
	// Azure or BurstGPT trace, never nil for the others). Equal ids are
	// equal content. A Mooncake trace's are also equal prefixes: across
	// it, an id always follows the same id, or always starts the prompt, so
	// no id appears twice in one request; a Mooncake request has
	// ceil(Input/BlockTokens) blocks. A Bailian trace hashes each block
	// alone (an id may follow different ids) and names at most
	// ceil(Input/16) blocks; tokens past the blocks named are the
	// request's own.
	Blocks []int64
	// BlockTokens is the tokens of each block Blocks names: 0 for the
	// constant BlockTokens (512, Mooncake's), 16 for a Bailian trace;
	// Simulate refuses one below 0 or over MaxTokens.
	BlockTokens int
	// N is the number of sequences the request samples from its one prompt
	// (vLLM's SamplingParams.n), each generating Output tokens of its own.
	// 0 and 1 both mean one sequence; a trace reader returns 0
	// where the trace does not say, and otherwise 1 to MaxN.
	N int
}

// BlockSize is the tokens of each of r's Blocks: r.BlockTokens, or the
// constant BlockTokens where that is 0.
func (r Request) BlockSize() int {
	if r.BlockTokens > 0 {
		return r.BlockTokens
	}
	return BlockTokens
}

// Sequences is the number of sequences r samples: N, or 1 where N is 0.
func (r Request) Sequences() int { return max(r.N, 1) }

func seqs(r Request) int { return r.Sequences() }

// azureHeader is the header line of an Azure LLM inference trace.
const azureHeader = "TIMESTAMP,ContextTokens,GeneratedTokens"

// azureTimeLayout is how an Azure trace writes a TIMESTAMP, before its
// fraction of a second.
const azureTimeLayout = "2006-01-02 15:04:05"

// ParseAzure reads an Azure LLM inference trace (Azure/AzurePublicDataset,
// AzureLLMInferenceTrace_*.csv): the header
//
//	TIMESTAMP,ContextTokens,GeneratedTokens
//
// then one request a line, such as
//
//	2023-11-16 18:15:46.6805900,374,44
//
// or, as the 2024 traces (AzureLLMInferenceTrace_*_1week.csv) write them,
//
//	2024-05-10 00:00:00.009930+00:00,2162,5
//
// The TIMESTAMP is a date and time of day, then optionally a fraction of a
// second of up to 9 digits (the 2023 traces write 7, the 2024 ones 6),
// then optionally an offset from UTC, +hh:mm or -hh:mm (the 2024 traces
// write +00:00). One without an offset is read as UTC, since the 2023
// traces name no zone and a local zone's daylight-saving change would bend
// the gaps between requests. A request's Arrival is its TIMESTAMP less the
// first request's, to the nanosecond. ContextTokens is Input,
// GeneratedTokens is Output, both decimal integers. Fields are separated
// by commas alone (no spaces, no quotes); lines end in LF or CRLF, and no
// line is empty. Requests must come in arrival order, as they do in the
// 2023 traces.
//
// A nil reader is an error marked driver.ErrInvalid. The first problem in
// the content (Request's rules, a line over MaxRequestLineBytes) is an
// error marked ErrMalformed that names its line; the header is line 1.
func ParseAzure(r io.Reader) ([]Request, error) {
	if isnil.Is(r) {
		return nil, errors.Wrap(driver.ErrInvalid, "serving: parse azure trace: the reader is nil")
	}
	lines := newLineScanner(r)
	h, err := csvHeader(lines, azureHeader)
	if err != nil {
		return nil, err
	}
	if h != azureHeader {
		return nil, malformed(1, "header %s, want %s", quote(h), azureHeader)
	}
	return azureRows(lines, 0)
}

// csvHeader reads a CSV trace's header line, less a byte-order mark;
// want says what an empty input lacks.
func csvHeader(lines *lineScanner, want string) (string, error) {
	if !lines.scan() {
		if lines.err != nil {
			return "", lines.err
		}
		return "", malformed(1, "empty input, want the header line %s", want)
	}
	return strings.TrimPrefix(lines.text, "\ufeff"), nil
}

// azureRows reads an Azure trace's requests, the first n (n <= 0: all),
// after its header.
func azureRows(lines *lineScanner, n int) ([]Request, error) {
	var (
		reqs  []Request
		first time.Time
		prev  time.Time
	)
	for lines.nextRequest(n, len(reqs)) {
		line := lines.line
		fields := strings.Split(lines.text, ",")
		if len(fields) != 3 {
			return nil, malformed(line, "%d fields, want 3 (%s)", len(fields), azureHeader)
		}
		t, err := parseAzureTime(fields[0])
		if err != nil {
			return nil, malformed(line, "TIMESTAMP %s: %v", quote(fields[0]), err)
		}
		if len(reqs) == 0 {
			first = t
		} else if t.Before(prev) {
			return nil, malformed(line, "TIMESTAMP %s is before the previous line's %s: requests must come in arrival order",
				fields[0], prev.Format(azureTimeLayout+".0000000"))
		}
		prev = t
		arrival := t.Sub(first) // saturates at the largest Duration, over MaxArrival
		if arrival > MaxArrival {
			return nil, malformed(line, "TIMESTAMP %s is %v after the first request's, more than MaxArrival (%v)", fields[0], arrival, MaxArrival)
		}
		in, err := parseTokens(fields[1])
		if err != nil {
			return nil, malformed(line, "ContextTokens %s %v", quote(fields[1]), err)
		}
		out, err := parseTokens(fields[2])
		if err != nil {
			return nil, malformed(line, "GeneratedTokens %s %v", quote(fields[2]), err)
		}
		reqs = append(reqs, Request{Arrival: arrival, Input: in, Output: out})
	}
	if lines.err != nil {
		return nil, lines.err
	}
	return reqs, nil
}

// tooManyRequests is the error of a trace of more than MaxRequests
// requests, at line line.
func tooManyRequests(line int) error {
	return malformed(line, "more than %d requests (MaxRequests): serve the first N of a longer trace (kv simulate --limit N, ParseRequestsFileFirst)",
		maxRequests)
}

// parseAzureTime reads a TIMESTAMP: exactly "YYYY-MM-DD hh:mm:ss" in
// digits, then optionally "." and 1 to 9 digits, then optionally an offset
// from UTC, "+hh:mm" or "-hh:mm" (at most 23:59); the time in UTC.
func parseAzureTime(s string) (time.Time, error) {
	const want = "want a time such as 2023-11-16 18:15:46.6805900 or 2024-05-10 00:00:00.009930+00:00"
	if len(s) < len(azureTimeLayout) {
		return time.Time{}, errors.New(want)
	}
	base, rest := s[:len(azureTimeLayout)], s[len(azureTimeLayout):]
	// time.Parse alone would take a one-digit hour or a signed year.
	for i := range len(base) {
		ok := base[i] == azureTimeLayout[i]
		if isDigit(azureTimeLayout[i]) {
			ok = isDigit(base[i])
		}
		if !ok {
			return time.Time{}, errors.New(want)
		}
	}
	var offset time.Duration
	if z := strings.IndexAny(rest, "+-"); z >= 0 {
		d, err := parseUTCOffset(rest[z:])
		if err != nil {
			return time.Time{}, err
		}
		offset, rest = d, rest[:z]
	}
	frac, hasFrac := strings.CutPrefix(rest, ".")
	if !hasFrac && rest != "" {
		return time.Time{}, errors.New(want)
	}
	t, err := time.Parse(azureTimeLayout, base)
	if err != nil {
		var pe *time.ParseError
		if errors.As(err, &pe) && pe.Message != "" {
			return time.Time{}, errors.New(strings.TrimPrefix(pe.Message, ": ")) // "month out of range"
		}
		return time.Time{}, errors.New(want)
	}
	t = t.Add(-offset)
	if !hasFrac {
		return t, nil
	}
	if len(frac) == 0 || len(frac) > 9 {
		return time.Time{}, errors.Newf("%d digits after the seconds' point, want 1 to 9", len(frac))
	}
	if !allDigits(frac) {
		return time.Time{}, errors.New("the fraction of a second is not all digits")
	}
	return t.Add(fractionNanos(frac)), nil
}

// allDigits says s is decimal digits only (true for "").
func allDigits(s string) bool { return strings.Trim(s, "0123456789") == "" }

// fractionNanos is the nanoseconds of the digits after a seconds' point,
// at most 9 of them, all digits.
func fractionNanos(frac string) time.Duration {
	ns := 0
	for i := range 9 {
		ns *= 10
		if i < len(frac) {
			ns += int(frac[i] - '0')
		}
	}
	return time.Duration(ns)
}

// parseUTCOffset reads "+hh:mm" or "-hh:mm", hh at most 23 and mm at most
// 59: how far the time it follows is ahead of UTC.
func parseUTCOffset(s string) (time.Duration, error) {
	const want = "the offset from UTC %s is not +hh:mm or -hh:mm (at most 23:59)"
	if len(s) != len("+hh:mm") || s[3] != ':' || !isDigit(s[1]) || !isDigit(s[2]) || !isDigit(s[4]) || !isDigit(s[5]) {
		return 0, errors.Newf(want, quote(s))
	}
	h, m := int(s[1]-'0')*10+int(s[2]-'0'), int(s[4]-'0')*10+int(s[5]-'0')
	if h > 23 || m > 59 {
		return 0, errors.Newf(want, quote(s))
	}
	d := time.Duration(h)*time.Hour + time.Duration(m)*time.Minute
	if s[0] == '-' {
		d = -d
	}
	return d, nil
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// The header lines of a BurstGPT trace: its first release's files
// (BurstGPT_1.csv, BurstGPT_without_fails_1.csv and their like) and the
// later ones with a session's id and elapsed time.
const (
	burstHeader        = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"
	burstSessionHeader = "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type"
)

// ParseBurstGPT reads a BurstGPT trace (HPMLL/BurstGPT: the request log of
// a ChatGPT and GPT-4 service): the header
//
//	Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
//
// or the later one with "Session ID" and "Elapsed time" after Timestamp
// (or those columns in another order, as an export of the dataset may
// write them; Timestamp, Request tokens and Response tokens must be among
// them), then one request a line, such as
//
//	5,ChatGPT,472,18,490,Conversation log
//
// Timestamp is seconds, a decimal number at least 0 with a fraction of up
// to 9 digits or none (the released files write whole seconds); a
// request's Arrival is its Timestamp less the first request's. Request
// tokens is Input and Response tokens Output, decimal integers; the other
// fields are not read (a failed request of the files with fails is 0
// tokens in and out, served as such). Fields are separated by commas
// alone, as in ParseAzure, lines end in LF or CRLF, and none is empty.
// Requests must come in arrival order.
//
// A nil reader is an error marked driver.ErrInvalid. The first problem in
// the content (Request's rules, a line over MaxRequestLineBytes) is an
// error marked ErrMalformed that names its line; the header is line 1.
func ParseBurstGPT(r io.Reader) ([]Request, error) {
	if isnil.Is(r) {
		return nil, errors.Wrap(driver.ErrInvalid, "serving: parse burstgpt trace: the reader is nil")
	}
	lines := newLineScanner(r)
	h, err := csvHeader(lines, burstHeader)
	if err != nil {
		return nil, err
	}
	cols, ok := burstColumns(h)
	if !ok {
		return nil, malformed(1, "header %s, want %s or %s (those columns in any order, Timestamp, Request tokens and Response tokens among them)",
			quote(h), burstHeader, burstSessionHeader)
	}
	return burstRows(lines, 0, cols)
}

// burstCols is where a BurstGPT header puts the fields read, and how many
// fields a line has.
type burstCols struct{ fields, time, input, output int }

// burstNames are the columns a BurstGPT trace may have: those of its two
// headers.
var burstNames = strings.Split(burstSessionHeader, ",")

// burstColumns is the columns of BurstGPT header h, if it is one: the
// names of burstNames, each at most once, in any order (an export of the
// dataset may reorder them), Timestamp, Request tokens and Response tokens
// among them.
func burstColumns(h string) (burstCols, bool) {
	names := strings.Split(h, ",")
	if len(names) > len(burstNames) {
		return burstCols{}, false
	}
	cols := burstCols{fields: len(names), time: -1, input: -1, output: -1}
	seen := map[string]bool{}
	for i, name := range names {
		if seen[name] || !slices.Contains(burstNames, name) {
			return burstCols{}, false
		}
		seen[name] = true
		switch name {
		case "Timestamp":
			cols.time = i
		case "Request tokens":
			cols.input = i
		case "Response tokens":
			cols.output = i
		}
	}
	return cols, cols.time >= 0 && cols.input >= 0 && cols.output >= 0
}

// burstRows reads a BurstGPT trace's requests, the first n (n <= 0: all),
// after its header.
func burstRows(lines *lineScanner, n int, cols burstCols) ([]Request, error) {
	var (
		reqs        []Request
		first, prev time.Duration
	)
	for lines.nextRequest(n, len(reqs)) {
		line := lines.line
		fields := strings.Split(lines.text, ",")
		if len(fields) != cols.fields {
			return nil, malformed(line, "%d fields, want %d", len(fields), cols.fields)
		}
		t, err := parseSeconds(fields[cols.time])
		if err != nil {
			return nil, malformed(line, "Timestamp %s %v", quote(fields[cols.time]), err)
		}
		if len(reqs) == 0 {
			first = t
		} else if t < prev {
			return nil, malformed(line, "Timestamp %s is before the previous line's %s: requests must come in arrival order",
				fields[cols.time], strconv.FormatFloat(prev.Seconds(), 'f', -1, 64))
		}
		prev = t
		if arrival := t - first; arrival > MaxArrival {
			return nil, malformed(line, "Timestamp %s is %v after the first request's, more than MaxArrival (%v)", fields[cols.time], arrival, MaxArrival)
		}
		in, err := parseTokens(fields[cols.input])
		if err != nil {
			return nil, malformed(line, "Request tokens %s %v", quote(fields[cols.input]), err)
		}
		out, err := parseTokens(fields[cols.output])
		if err != nil {
			return nil, malformed(line, "Response tokens %s %v", quote(fields[cols.output]), err)
		}
		reqs = append(reqs, Request{Arrival: t - first, Input: in, Output: out})
	}
	if lines.err != nil {
		return nil, lines.err
	}
	return reqs, nil
}

// maxSeconds bounds a time parseSeconds reads, so that it is a
// time.Duration (292 years).
const maxSeconds = uint64(math.MaxInt64/int64(time.Second)) - 1

// parseSeconds reads a time in seconds: decimal digits, then optionally
// "." and 1 to 9 digits, at most maxSeconds. Its error completes a
// sentence that starts with the field's name.
func parseSeconds(s string) (time.Duration, error) {
	whole, frac, hasFrac := strings.Cut(s, ".")
	if whole == "" || !allDigits(whole) {
		return 0, errors.New("is not a number of seconds of at least 0, such as 5 or 5.25")
	}
	if hasFrac && (frac == "" || len(frac) > 9 || !allDigits(frac)) {
		return 0, errors.New("is not a number of seconds with 1 to 9 digits after its point")
	}
	secs, err := strconv.ParseUint(whole, 10, 64)
	if err != nil || secs > maxSeconds {
		return 0, errors.Newf("is over %d seconds", maxSeconds)
	}
	return time.Duration(secs)*time.Second + fractionNanos(frac), nil
}

// ParseMooncake reads a Mooncake trace (kvcache-ai/Mooncake,
// FAST25-release/traces): one JSON object a line, such as
//
//	{"timestamp": 0, "input_length": 600, "output_length": 6, "hash_ids": [0, 1]}
//
// timestamp is in milliseconds; a request's Arrival is its timestamp less
// the first request's. input_length is Input, output_length Output, and
// hash_ids Blocks. Each object has these four fields, once each and no
// other (a misspelt field would otherwise go missing without a word);
// every number is a decimal integer (no fraction, no exponent), the
// timestamp and lengths at least 0. Lines end in LF or CRLF, and no line
// is empty. Requests must come in arrival order, as they do in the real
// trace, and hash_ids must name ceil(input_length/BlockTokens) blocks that
// keep Request's rule on Blocks, as the real trace does. An object may
// also have the field n, once, an integer from 1 to MaxN: Request.N (the
// real trace has none; absent, N is 0, one sequence).
//
// A nil reader is an error marked driver.ErrInvalid. The first problem in
// the content (Request's rules, a line over MaxRequestLineBytes) is an
// error marked ErrMalformed that names its line, the first being line 1.
func ParseMooncake(r io.Reader) ([]Request, error) {
	if isnil.Is(r) {
		return nil, errors.Wrap(driver.ErrInvalid, "serving: parse mooncake trace: the reader is nil")
	}
	return mooncakeRows(newLineScanner(r), 0)
}

// mooncakeRows reads a Mooncake trace's requests, the first n (n <= 0:
// all).
func mooncakeRows(lines *lineScanner, n int) ([]Request, error) {
	var (
		reqs        []Request
		first, prev int64 // timestamps, in ms
		// follows is, for each block id seen, the id before it in its
		// prompt (or noBlock) and the line that first said so.
		follows = map[int64]blockSeen{}
		blocks  int // hash ids named so far
	)
	for lines.nextRequest(n, len(reqs)) {
		line, text := lines.line, lines.text
		m, err := decodeMooncakeLine(text)
		if err != nil {
			return nil, malformed(line, "%v", err)
		}
		if len(reqs) == 0 {
			first = m.timestamp
		} else if m.timestamp < prev {
			return nil, malformed(line, "timestamp %d is before the previous line's %d: requests must come in arrival order", m.timestamp, prev)
		}
		prev = m.timestamp
		if d := m.timestamp - first; d > int64(MaxArrival/time.Millisecond) {
			after := strconv.FormatInt(d, 10) + "ms" // past the largest Duration
			if d <= math.MaxInt64/int64(time.Millisecond) {
				after = (time.Duration(d) * time.Millisecond).String()
			}
			return nil, malformed(line, "timestamp %d is %s after the first request's, more than MaxArrival (%v)",
				m.timestamp, after, MaxArrival)
		}
		if want := (m.input + BlockTokens - 1) / BlockTokens; len(m.blocks) != want {
			return nil, malformed(line, "%d hash_ids for input_length %d, want %d (one per %d tokens, the last one partial)",
				len(m.blocks), m.input, want, BlockTokens)
		}
		if blocks += len(m.blocks); blocks > maxRequestBlocks {
			return nil, malformed(line, "more than %d hash_ids in the trace (MaxRequestBlocks)", maxRequestBlocks)
		}
		for i, id := range m.blocks {
			before := noBlock
			if i > 0 {
				before = blockSeen{id: m.blocks[i-1]}
			}
			seen, ok := follows[id]
			if !ok {
				before.line = line
				follows[id] = before
				continue
			}
			if seen.id != before.id || seen.first != before.first {
				return nil, malformed(line, "hash_ids[%d] is %d %s here but %s on line %d: equal ids must name equal prefixes",
					i, id, before.describe(), seen.describe(), seen.line)
			}
		}
		reqs = append(reqs, Request{
			Arrival: time.Duration(m.timestamp-first) * time.Millisecond,
			Input:   m.input,
			Output:  m.output,
			Blocks:  m.blocks,
			N:       m.n,
		})
	}
	if lines.err != nil {
		return nil, lines.err
	}
	return reqs, nil
}

// ParseBailian reads a trace of the Qwen-Bailian dataset
// (alibaba-edu/qwen-bailian-usagetraces-anon, qwen_*_blksz_16.jsonl: the
// requests of a Qwen serving cluster on Alibaba Cloud Bailian): one JSON
// object a line, such as
//
//	{"chat_id": 159, "parent_chat_id": 55, "timestamp": 61.114, "input_length": 521, "output_length": 132, "type": "text", "turn": 2, "hash_ids": [1089, 1090]}
//
// timestamp is seconds, a JSON number at least 0 (a fraction and an
// exponent allowed, as Python writes floats), read to the nanosecond; a
// request's Arrival is its timestamp less the first request's.
// input_length is Input and output_length Output, integers at least 0;
// hash_ids name the prompt's 16-token blocks, each hashed alone, at most
// ceil(input_length/16) of them (Request.Blocks, BlockTokens 16); chat_id
// (an integer at least 0), parent_chat_id (at least -1, for a first turn),
// turn (at least 0) and type (a string) are checked and not kept. Each of
// these fields at most once and no other; timestamp, input_length,
// output_length, hash_ids and chat_id are required. Lines end in LF or
// CRLF, none is empty, and requests must come in arrival order.
//
// A nil reader is an error marked driver.ErrInvalid. The first problem in
// the content (Request's rules, a line over MaxRequestLineBytes) is an
// error marked ErrMalformed that names its line, the first being line 1.
func ParseBailian(r io.Reader) ([]Request, error) {
	if isnil.Is(r) {
		return nil, errors.Wrap(driver.ErrInvalid, "serving: parse bailian trace: the reader is nil")
	}
	return bailianRows(newLineScanner(r), 0)
}

// bailianBlockTokens is the tokens of a Bailian trace's block.
const bailianBlockTokens = 16

// bailianFields are a Bailian line's fields; the first five are required.
var bailianFields = []string{"timestamp", "input_length", "output_length", "hash_ids", "chat_id", "parent_chat_id", "turn", "type"}

// bailianRows reads a Bailian trace's requests, the first n (n <= 0: all).
func bailianRows(lines *lineScanner, n int) ([]Request, error) {
	var (
		reqs        []Request
		first, prev time.Duration
		blocks      int
	)
	for lines.nextRequest(n, len(reqs)) {
		line, text := lines.line, lines.text
		r, err := decodeBailianLine(text)
		if err != nil {
			return nil, malformed(line, "%v", err)
		}
		if len(reqs) == 0 {
			first = r.Arrival
		} else if r.Arrival < prev {
			return nil, malformed(line, "timestamp %s is before the previous line's %s: requests must come in arrival order",
				strconv.FormatFloat(r.Arrival.Seconds(), 'f', -1, 64), strconv.FormatFloat(prev.Seconds(), 'f', -1, 64))
		}
		prev = r.Arrival
		if r.Arrival -= first; r.Arrival > MaxArrival {
			return nil, malformed(line, "timestamp %s is %v after the first request's, more than MaxArrival (%v)",
				strconv.FormatFloat(prev.Seconds(), 'f', -1, 64), r.Arrival, MaxArrival)
		}
		if most := (r.Input + bailianBlockTokens - 1) / bailianBlockTokens; len(r.Blocks) > most {
			return nil, malformed(line, "%d hash_ids for input_length %d, want at most %d (one per %d tokens, the last one partial)",
				len(r.Blocks), r.Input, most, bailianBlockTokens)
		}
		if blocks += len(r.Blocks); blocks > maxRequestBlocks {
			return nil, malformed(line, "more than %d hash_ids in the trace (MaxRequestBlocks)", maxRequestBlocks)
		}
		reqs = append(reqs, r)
	}
	if lines.err != nil {
		return nil, lines.err
	}
	return reqs, nil
}

// decodeBailianLine reads one object of a Bailian trace (decodeObject);
// its Arrival is the timestamp as written.
func decodeBailianLine(text string) (Request, error) {
	r := Request{BlockTokens: bailianBlockTokens}
	err := decodeObject(text, bailianFields[:5], bailianFields[5:], func(dec *json.Decoder, key string) error {
		var err error
		switch key {
		case "timestamp":
			r.Arrival, err = seconds(dec, key)
		case "input_length", "output_length":
			var v int64
			v, err = nonNegative(dec, key, MaxTokens)
			if key == "input_length" {
				r.Input = int(v)
			} else {
				r.Output = int(v)
			}
		case "hash_ids":
			r.Blocks, err = blockIDs(dec, bailianBlockTokens)
		case "chat_id", "turn":
			_, err = nonNegative(dec, key, 1<<63-1)
		case "parent_chat_id":
			_, err = atLeastMinusOne(dec, key)
		case "type":
			tok, terr := dec.Token()
			if terr != nil {
				return jsonError(terr)
			}
			if _, ok := tok.(string); !ok {
				err = errors.Newf("type is %s, want a string", describeToken(tok))
			}
		}
		return err
	})
	return r, err
}

// seconds reads a JSON number of seconds from 0 to maxSeconds, to the
// nanosecond: exactly where it is written as digits with at most 9 after
// the point, else (an exponent, or the 17 digits of a float's shortest
// form) as the nearest nanosecond to its float64 value.
func seconds(dec *json.Decoder, key string) (time.Duration, error) {
	n, err := wantNumber(dec, key)
	if err != nil {
		return 0, err
	}
	if d, err := parseSeconds(n.String()); err == nil {
		return d, nil
	}
	f, perr := strconv.ParseFloat(n.String(), 64)
	if perr != nil || math.IsNaN(f) || f < 0 || f > float64(maxSeconds) {
		return 0, errors.Newf("%s %s is not a number of seconds from 0 to %d", key, quote(n.String()), maxSeconds)
	}
	return time.Duration(math.Round(f * float64(time.Second))), nil
}

// atLeastMinusOne reads an integer at least -1.
func atLeastMinusOne(dec *json.Decoder, key string) (int64, error) {
	n, err := wantNumber(dec, key)
	if err != nil {
		return 0, err
	}
	v, perr := strconv.ParseInt(n.String(), 10, 64)
	if perr != nil || v < -1 {
		return 0, errors.Newf("%s %s is not an integer of at least -1%s", key, quote(n.String()), rangeNote(perr))
	}
	return v, nil
}

// blockSeen is what precedes a block id in its prompt: the id before it,
// or nothing when first is set.
type blockSeen struct {
	id    int64
	first bool
	line  int
}

var noBlock = blockSeen{first: true}

func (b blockSeen) describe() string {
	if b.first {
		return "starting the prompt"
	}
	return "after " + strconv.FormatInt(b.id, 10)
}

// mooncakeRequest is one line of a Mooncake trace, decoded.
type mooncakeRequest struct {
	timestamp     int64
	input, output int
	blocks        []int64
	n             int // 0 where the line has no n
}

var mooncakeFields = []string{"timestamp", "input_length", "output_length", "hash_ids"}

// decodeMooncakeLine reads one object of a Mooncake trace
// (decodeObject): its four fields, and n if it has one.
func decodeMooncakeLine(text string) (mooncakeRequest, error) {
	var m mooncakeRequest
	err := decodeObject(text, mooncakeFields, []string{"n"}, func(dec *json.Decoder, key string) error {
		var err error
		switch key {
		case "n":
			var n int64
			if n, err = nonNegative(dec, key, MaxN); err == nil && n == 0 {
				err = errors.Newf("n 0 is under 1: a request samples at least one sequence")
			}
			m.n = int(n)
		case "timestamp":
			m.timestamp, err = nonNegative(dec, key, 1<<63-1)
		case "input_length", "output_length":
			var n int64
			n, err = nonNegative(dec, key, MaxTokens)
			if key == "input_length" {
				m.input = int(n)
			} else {
				m.output = int(n)
			}
		case "hash_ids":
			m.blocks, err = blockIDs(dec, BlockTokens)
		}
		return err
	})
	return m, err
}

// decodeObject reads text as one JSON object token by token, for exact
// field names (encoding/json matches them without regard to case), each
// field once, every required one and no field but those and the
// optional ones, and numbers as written (json.Number): field reads the
// value of each, the decoder just past its key.
func decodeObject(text string, required, optional []string, field func(dec *json.Decoder, key string) error) error {
	dec := json.NewDecoder(strings.NewReader(text))
	dec.UseNumber()
	if err := wantDelim(dec, '{', "a JSON object"); err != nil {
		return err
	}
	have := make([]bool, len(required)+len(optional))
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return jsonError(err)
		}
		key, _ := tok.(string) // inside an object, a key is a string
		k := slices.Index(required, key)
		if k < 0 {
			if k = slices.Index(optional, key); k >= 0 {
				k += len(required)
			}
		}
		switch {
		case k < 0:
			return errors.Newf("unknown field %s, want the fields %s (and optionally %s)", quote(key), strings.Join(required, ", "), strings.Join(optional, ", "))
		case have[k]:
			return errors.Newf("field %s twice", key)
		}
		have[k] = true
		if err := field(dec, key); err != nil {
			return err
		}
	}
	if err := wantDelim(dec, '}', "the object's end"); err != nil {
		return err
	}
	for k, f := range required {
		if !have[k] {
			return errors.Newf("no field %s (a request has the fields %s)", f, strings.Join(required, ", "))
		}
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("more after the object's end: want one object a line")
	}
	return nil
}

// nonNegative reads an integer from 0 to max.
func nonNegative(dec *json.Decoder, key string, max int64) (int64, error) {
	n, err := wantNumber(dec, key)
	if err != nil {
		return 0, err
	}
	v, perr := strconv.ParseInt(n.String(), 10, 64)
	switch {
	case perr != nil && !errors.Is(perr, strconv.ErrRange):
		return 0, errors.Newf("%s %s is not an integer", key, quote(n.String()))
	case v < 0: // ParseInt's answer out of range is the bound of the number's sign
		return 0, errors.Newf("%s %s is negative", key, quote(n.String()))
	case perr != nil || v > max:
		return 0, errors.Newf("%s %s is over %d", key, quote(n.String()), max)
	}
	return v, nil
}

// blockIDs reads the array of hash_ids, each an int64.
func blockIDs(dec *json.Decoder, blockTokens int) ([]int64, error) {
	if err := wantDelim(dec, '[', "hash_ids as an array of integers"); err != nil {
		return nil, err
	}
	ids := []int64{}
	for dec.More() {
		if len(ids) == MaxTokens/blockTokens {
			return nil, errors.Newf("more than %d hash_ids (MaxTokens over %d-token blocks)", MaxTokens/blockTokens, blockTokens)
		}
		n, err := wantNumber(dec, "hash_ids["+strconv.Itoa(len(ids))+"]")
		if err != nil {
			return nil, err
		}
		id, perr := strconv.ParseInt(n.String(), 10, 64)
		if perr != nil {
			return nil, errors.Newf("hash_ids[%d] %s is not an integer%s", len(ids), quote(n.String()), rangeNote(perr))
		}
		ids = append(ids, id)
	}
	return ids, wantDelim(dec, ']', "the end of hash_ids")
}

func wantNumber(dec *json.Decoder, what string) (json.Number, error) {
	tok, err := dec.Token()
	if err != nil {
		return "", jsonError(err)
	}
	n, ok := tok.(json.Number)
	if !ok {
		return "", errors.Newf("%s is %s, want an integer", what, describeToken(tok))
	}
	return n, nil
}

func wantDelim(dec *json.Decoder, d json.Delim, what string) error {
	tok, err := dec.Token()
	if err == io.EOF {
		return errors.Newf("the line ends where %s belongs", what)
	}
	if err != nil {
		return jsonError(err)
	}
	if tok != d {
		return errors.Newf("%s where %s belongs", describeToken(tok), what)
	}
	return nil
}

func describeToken(tok json.Token) string {
	switch v := tok.(type) {
	case json.Delim:
		return "'" + v.String() + "'"
	case string:
		return "the string " + quote(v)
	case json.Number:
		return "the number " + quote(v.String())
	case nil:
		return "null"
	}
	return strconv.FormatBool(tok.(bool))
}

// jsonError says what encoding/json found wrong; io.ErrUnexpectedEOF is a
// line that ends mid-object.
func jsonError(err error) error {
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return errors.New("the line ends inside the object")
	}
	return errors.Newf("not JSON: %v", err)
}

// ParseRequestsFile reads the request trace in the named file, by its
// extension: .csv is an Azure trace (ParseAzure) or a BurstGPT one
// (ParseBurstGPT), as its header line says, .jsonl a Mooncake one
// (ParseMooncake) or a Bailian one (ParseBailian), as its first line's
// fields say. Another extension is an error marked driver.ErrInvalid,
// and so is a file that is not a regular one (a directory, a device, a
// FIFO).
func ParseRequestsFile(name string) ([]Request, error) { return ParseRequestsFileFirst(name, 0) }

// ParseRequestsFileFirst is ParseRequestsFile of the trace's first n
// requests (n <= 0: all of them): it stops reading at the nth request's
// line, so the rest of the file is neither read nor checked, and a trace
// longer than MaxRequests (the 2024 Azure conversation trace has 27.3
// million) can be served in part.
func ParseRequestsFileFirst(name string, n int) ([]Request, error) {
	var parse func(io.Reader, int) ([]Request, error)
	switch ext := strings.ToLower(filepath.Ext(name)); ext {
	case ".csv":
		parse = parseCSV
	case ".jsonl":
		parse = parseJSONL
	default:
		return nil, errors.WithHint(errors.Wrapf(driver.ErrInvalid, "serving: %s: no request trace format for extension %q", name, ext),
			"name an Azure or BurstGPT trace .csv or a Mooncake or Bailian trace .jsonl")
	}
	f, err := in.Open(name, "request trace")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parse(f, n)
}

// parseJSONL reads the first n requests (n <= 0: all) of a Mooncake or a
// Bailian trace: a Bailian one where the first line has the field
// chat_id.
func parseJSONL(r io.Reader, n int) ([]Request, error) {
	lines := newLineScanner(r)
	if !lines.scan() {
		return nil, lines.err
	}
	bailian := isBailianLine(strings.TrimPrefix(lines.text, "\ufeff"))
	lines.unscan()
	if bailian {
		return bailianRows(lines, n)
	}
	return mooncakeRows(lines, n)
}

// isBailianLine says line is a JSON object with the key chat_id at its top
// level, which no Mooncake line has.
func isBailianLine(line string) bool {
	dec := json.NewDecoder(strings.NewReader(line))
	dec.UseNumber()
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return false
	}
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return false
		}
		if key == "chat_id" {
			return true
		}
		var skip json.RawMessage
		if dec.Decode(&skip) != nil {
			return false
		}
	}
	return false
}

// parseCSV reads the first n requests (n <= 0: all) of an Azure or a
// BurstGPT trace, as its header says.
func parseCSV(r io.Reader, n int) ([]Request, error) {
	lines := newLineScanner(r)
	h, err := csvHeader(lines, azureHeader)
	if err != nil {
		return nil, err
	}
	if h == azureHeader {
		return azureRows(lines, n)
	}
	if cols, ok := burstColumns(h); ok {
		return burstRows(lines, n, cols)
	}
	return nil, malformed(1, "header %s, want an Azure trace's %s or a BurstGPT trace's %s (or %s)",
		quote(h), azureHeader, burstHeader, burstSessionHeader)
}

// parseTokens reads a token count: a decimal integer from 0 to MaxTokens.
// Its error completes a sentence that starts with the field's name.
func parseTokens(s string) (int, error) {
	v, err := strconv.ParseUint(s, 10, 64)
	switch {
	case err != nil && !errors.Is(err, strconv.ErrRange):
		return 0, errors.New("is not an integer of at least 0")
	case err != nil || v > MaxTokens:
		return 0, errors.Newf("is over MaxTokens (%d)", MaxTokens)
	}
	return int(v), nil
}

// lineScanner reads a request trace line by line, with lines no longer
// than MaxRequestLineBytes and none empty.
type lineScanner struct {
	sc *bufio.Scanner
	// line is the number of the line in text, from 1.
	line int
	text string
	// err is the first problem found, reading or in a line; scan returns
	// false from then on.
	err error
	// again makes the next scan return the line scanned last once more
	// (unscan).
	again bool
}

// nextRequest scans the line of a trace's next request, having read have
// requests of the first n (n <= 0: all): false at the end, past the nth,
// past MaxRequests (err says so) or at a problem in the line. A first
// line's byte-order mark is dropped.
func (s *lineScanner) nextRequest(n, have int) bool {
	if (n > 0 && have >= n) || !s.scan() {
		return false
	}
	if have == maxRequests {
		s.err = tooManyRequests(s.line)
		return false
	}
	if s.line == 1 {
		s.text = strings.TrimPrefix(s.text, "\ufeff")
	}
	return true
}

// unscan makes the next scan return the line the last one returned: a
// reader that read the first line to tell the trace's format reads it
// again as a request.
func (s *lineScanner) unscan() { s.again = s.line > 0 && s.err == nil }

func newLineScanner(r io.Reader) *lineScanner {
	sc := bufio.NewScanner(in.Reader(r, MaxTraceBytes, 0))
	// Room for a line, its CR and LF: bufio.Scanner refuses a token that
	// fills its buffer.
	sc.Buffer(make([]byte, 0, 64<<10), MaxRequestLineBytes+3)
	sc.Split(scanLines)
	return &lineScanner{sc: sc}
}

// scanLines is bufio.ScanLines but for dropping the CR of a CRLF: it keeps
// the line ending, for scan to tell an empty line and a line's length.
func scanLines(data []byte, atEOF bool) (advance int, token []byte, err error) {
	if i := bytes.IndexByte(data, '\n'); i >= 0 {
		return i + 1, data[:i+1], nil
	}
	if atEOF && len(data) > 0 {
		return len(data), data, nil
	}
	return 0, nil, nil
}

func (s *lineScanner) scan() bool {
	if s.err != nil {
		return false
	}
	if s.again {
		s.again = false
		return true
	}
	if !s.sc.Scan() {
		switch err := s.sc.Err(); {
		case errors.Is(err, bufio.ErrTooLong):
			s.err = malformed(s.line+1, "longer than %d bytes (MaxRequestLineBytes)", MaxRequestLineBytes)
		case errors.Is(err, ErrMalformed): // a bound of boundedReader
			s.err = err
		case err != nil:
			s.err = errors.Wrap(err, "serving: read")
		}
		return false
	}
	s.line++
	b := s.sc.Bytes()
	b = bytes.TrimSuffix(b, []byte("\n"))
	b = bytes.TrimSuffix(b, []byte("\r"))
	switch {
	case len(b) > MaxRequestLineBytes:
		s.err = malformed(s.line, "longer than %d bytes (MaxRequestLineBytes)", MaxRequestLineBytes)
		return false
	case len(b) == 0:
		s.err = malformed(s.line, "empty line")
		return false
	}
	s.text = string(b)
	return true
}

// quote is s quoted for an error message, cut short past 40 bytes: a line
// may be a megabyte long.
func quote(s string) string {
	const most = 40
	if len(s) <= most {
		return strconv.Quote(s)
	}
	return strconv.Quote(s[:most]) + "..."
}
