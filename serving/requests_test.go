package serving

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
)

const azureHead = azureHeader + "\n"

func TestParseAzure(t *testing.T) {
	reqs, err := ParseAzure(strings.NewReader(azureHead +
		"2023-11-16 18:15:46.6805900,374,44\n" +
		"2023-11-16 18:15:50.9951690,396,109\n" +
		"2023-11-16 18:15:50.9951690,0,0\n" + // the same time: arrival order holds
		"2023-11-16 18:16:00,16777216,1\n" + // no fraction; MaxTokens
		"2023-11-17 00:00:00.000000001,1,2")) // past midnight, to the nanosecond, no final LF
	require.NoError(t, err)
	require.Equal(t, []Request{
		{Arrival: 0, Input: 374, Output: 44},
		{Arrival: 4314579 * time.Microsecond, Input: 396, Output: 109},
		{Arrival: 4314579 * time.Microsecond, Input: 0, Output: 0},
		{Arrival: 13*time.Second + 319410*time.Microsecond, Input: MaxTokens, Output: 1},
		{Arrival: 5*time.Hour + 44*time.Minute + 13*time.Second + 319410*time.Microsecond + time.Nanosecond, Input: 1, Output: 2},
	}, reqs)

	t.Run("header only", func(t *testing.T) {
		reqs, err := ParseAzure(strings.NewReader(azureHead))
		require.NoError(t, err)
		require.Empty(t, reqs)
	})
	t.Run("CRLF and a byte-order mark", func(t *testing.T) {
		reqs, err := ParseAzure(strings.NewReader("\ufeff" + azureHeader + "\r\n2023-11-16 18:15:46.5,1,2\r\n2023-11-16 18:15:47.25,3,4\r\n"))
		require.NoError(t, err)
		require.Equal(t, []Request{{Input: 1, Output: 2}, {Arrival: 750 * time.Millisecond, Input: 3, Output: 4}}, reqs)
	})
	t.Run("the 2024 traces' form", func(t *testing.T) {
		// The first lines of AzureLLMInferenceTrace_code_1week.csv (2024),
		// then a time with no fraction, and offsets other than UTC's.
		reqs, err := ParseAzure(strings.NewReader(azureHead +
			"2024-05-10 00:00:00.009930+00:00,2162,5\n" +
			"2024-05-10 00:00:00.017335+00:00,2399,6\n" +
			"2024-05-10 00:00:01+00:00,76,15\n" +
			"2024-05-10 05:30:02.5+05:30,1,1\n" + // 00:00:02.5 UTC
			"2024-05-09 23:00:03-01:00,1,1\n" + // 00:00:03 UTC
			"2024-05-10 00:00:03,1,1\n")) // no offset: UTC
		require.NoError(t, err)
		require.Equal(t, []Request{
			{Input: 2162, Output: 5},
			{Arrival: 7405 * time.Microsecond, Input: 2399, Output: 6},
			{Arrival: 990070 * time.Microsecond, Input: 76, Output: 15},
			{Arrival: 2490070 * time.Microsecond, Input: 1, Output: 1},
			{Arrival: 2990070 * time.Microsecond, Input: 1, Output: 1},
			{Arrival: 2990070 * time.Microsecond, Input: 1, Output: 1},
		}, reqs)
	})
	t.Run("read as UTC: no daylight-saving hour", func(t *testing.T) {
		// Europe's clocks went back an hour at 01:00 UTC on 2023-10-29.
		reqs, err := ParseAzure(strings.NewReader(azureHead + "2023-10-29 00:30:00,1,1\n2023-10-29 03:30:00,1,1\n"))
		require.NoError(t, err)
		require.Equal(t, 3*time.Hour, reqs[1].Arrival)
	})
}

// requireMalformed: err is marked ErrMalformed (and nothing else the
// project marks), names line, and says what is wrong.
func requireMalformed(t *testing.T, err error, line int, says string) {
	t.Helper()
	drivertest.RequireIs(t, err, ErrMalformed, fmt.Sprintf("serving: line %d: ", line), says)
}

func TestParseAzureMalformed(t *testing.T) {
	good := "2023-11-16 18:15:46.6805900,374,44\n"
	for _, tc := range []struct {
		name, input string
		line        int
		says        string
	}{
		{"empty input", "", 1, "empty input, want the header line TIMESTAMP,ContextTokens,GeneratedTokens"},
		{"no header", good, 1, `header "2023-11-16 18:15:46.6805900,374,44", want TIMESTAMP`},
		{"header in lower case", "timestamp,contexttokens,generatedtokens\n", 1, "header"},
		{"header with spaces", "TIMESTAMP, ContextTokens, GeneratedTokens\n", 1, "header"},
		{"empty line", azureHead + good + "\n" + good, 3, "empty line"},
		{"blank last line", azureHead + good + "\r\n", 3, "empty line"},
		{"too few fields", azureHead + good + "2023-11-16 18:15:47,374\n", 3, "2 fields, want 3"},
		{"too many fields", azureHead + "2023-11-16 18:15:47,374,44,1\n", 2, "4 fields, want 3"},
		{"quoted field", azureHead + `"2023-11-16 18:15:47",374,44` + "\n", 2, `TIMESTAMP "\"2023-11-16 18:15:47\"": want a time such as`},
		{"date only", azureHead + "2023-11-16,374,44\n", 2, "want a time such as"},
		{"T between date and time", azureHead + "2023-11-16T18:15:47,374,44\n", 2, "want a time such as"},
		{"one-digit hour", azureHead + "2023-11-16 8:15:47.12,374,44\n", 2, "want a time such as"},
		{"signed year", azureHead + "+023-11-16 18:15:47,374,44\n", 2, "want a time such as"},
		{"month out of range", azureHead + "2023-13-16 18:15:47,374,44\n", 2, "month out of range"},
		{"no such day", azureHead + "2023-11-31 18:15:47,374,44\n", 2, "day out of range"},
		{"leap second", azureHead + "2023-12-31 23:59:60,374,44\n", 2, "second out of range"},
		{"point and no digits", azureHead + "2023-11-16 18:15:47.,374,44\n", 2, "0 digits after the seconds' point, want 1 to 9"},
		{"ten digits", azureHead + "2023-11-16 18:15:47.1234567891,374,44\n", 2, "10 digits after the seconds' point"},
		{"fraction not digits", azureHead + "2023-11-16 18:15:47.12x,374,44\n", 2, "not all digits"},
		{"two points", azureHead + "2023-11-16 18:15:47.1.2,374,44\n", 2, "not all digits"},
		{"offset without a colon", azureHead + "2024-05-10 00:00:00.009930+0000,374,44\n", 2, `the offset from UTC "+0000" is not +hh:mm or -hh:mm`},
		{"offset of a day", azureHead + "2024-05-10 00:00:00+24:00,374,44\n", 2, `the offset from UTC "+24:00" is not`},
		{"offset's minutes", azureHead + "2024-05-10 00:00:00-01:60,374,44\n", 2, `the offset from UTC "-01:60" is not`},
		{"offset not digits", azureHead + "2024-05-10 00:00:00+0a:00,374,44\n", 2, `the offset from UTC "+0a:00" is not`},
		{"two offsets", azureHead + "2024-05-10 00:00:00+00:00+00:00,374,44\n", 2, `the offset from UTC "+00:00+00:00" is not`},
		{"offset before the fraction", azureHead + "2024-05-10 00:00:00+00:00.5,374,44\n", 2, `the offset from UTC "+00:00.5" is not`},
		{"zone letter", azureHead + "2024-05-10 00:00:00Z,374,44\n", 2, "want a time such as"},
		{"zone name", azureHead + "2024-05-10 00:00:00 UTC,374,44\n", 2, "want a time such as"},
		{"backwards across zones", azureHead + "2024-05-10 00:00:00+00:00,1,1\n2024-05-10 00:30:00+01:00,1,1\n", 3,
			"is before the previous line's 2024-05-10 00:00:00.0000000"},
		{"backwards", azureHead + good + "2023-11-16 18:15:46.6805899,1,1\n", 3,
			`TIMESTAMP 2023-11-16 18:15:46.6805899 is before the previous line's 2023-11-16 18:15:46.6805900: requests must come in arrival order`},
		{"after MaxArrival", azureHead + good + "2024-11-16 18:15:46.6805900,1,1\n", 3, "is 8784h0m0s after the first request's, more than MaxArrival (8760h0m0s)"},
		{"years apart", azureHead + "0001-01-01 00:00:00,1,1\n9999-12-31 23:59:59,1,1\n", 3, "more than MaxArrival"},
		{"negative context", azureHead + "2023-11-16 18:15:47,-1,44\n", 2, `ContextTokens "-1" is not an integer of at least 0`},
		{"context with a space", azureHead + "2023-11-16 18:15:47, 374,44\n", 2, `ContextTokens " 374" is not an integer`},
		{"empty generated", azureHead + "2023-11-16 18:15:47,374,\n", 2, `GeneratedTokens "" is not an integer`},
		{"fractional generated", azureHead + "2023-11-16 18:15:47,374,4.5\n", 2, `GeneratedTokens "4.5" is not an integer`},
		{"context over MaxTokens", azureHead + "2023-11-16 18:15:47,16777217,44\n", 2, `ContextTokens "16777217" is over MaxTokens (16777216)`},
		{"generated out of range", azureHead + "2023-11-16 18:15:47,1,99999999999999999999999\n", 2, "is over MaxTokens"},
		{"lone CR", azureHead + "2023-11-16 18:15:47,1,2\r3\n", 2, `GeneratedTokens "2\r3"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reqs, err := ParseAzure(strings.NewReader(tc.input))
			require.Nil(t, reqs)
			requireMalformed(t, err, tc.line, tc.says)
		})
	}
}

const burstHead = burstHeader + "\n"

// TestParseBurstGPT: both headers, in the form the released files write
// (these lines are made up in it, not copied from them).
func TestParseBurstGPT(t *testing.T) {
	want := []Request{
		{Arrival: 0, Input: 472, Output: 18},
		{Arrival: 40 * time.Second, Input: 1087, Output: 230},
		{Arrival: 40 * time.Second, Input: 0, Output: 0}, // a failed request; the same time
		{Arrival: 113*time.Second + 250*time.Millisecond, Input: 417, Output: 276},
		{Arrival: 5270409 * time.Second, Input: MaxTokens, Output: 1},
	}
	reqs, err := ParseBurstGPT(strings.NewReader(burstHead +
		"5,ChatGPT,472,18,490,Conversation log\n" +
		"45,ChatGPT,1087,230,1317,Conversation log\n" +
		"45.0,ChatGPT,0,0,0,Conversation log\n" +
		"118.25,GPT-4,417,276,693,API log\n" +
		"5270414,GPT-4,16777216,1,16777217,API log")) // no final LF
	require.NoError(t, err)
	require.Equal(t, want, reqs)

	t.Run("with sessions", func(t *testing.T) {
		reqs, err := ParseBurstGPT(strings.NewReader("\ufeff" + burstSessionHeader + "\r\n" +
			"5,4f1c3e2a-0000-4000-8000-000000000001,0.5,ChatGPT,472,18,490,Conversation log\r\n" +
			"45,4f1c3e2a-0000-4000-8000-000000000002,1.25,ChatGPT,1087,230,1317,Conversation log\r\n"))
		require.NoError(t, err)
		require.Equal(t, want[:2], reqs)
	})
	t.Run("columns in another order", func(t *testing.T) {
		reqs, err := ParseBurstGPT(strings.NewReader("Log Type,Timestamp,Request tokens,Response tokens,Total tokens,Model\n" +
			"Conversation log,5.0,472,18,490,ChatGPT\nConversation log,45.0,1087,230,1317,ChatGPT\n"))
		require.NoError(t, err)
		require.Equal(t, want[:2], reqs)
		reqs, err = ParseBurstGPT(strings.NewReader("Request tokens,Response tokens,Timestamp\n472,18,5\n"))
		require.NoError(t, err)
		require.Equal(t, want[:1], reqs)
	})
	t.Run("header only", func(t *testing.T) {
		reqs, err := ParseBurstGPT(strings.NewReader(burstHead))
		require.NoError(t, err)
		require.Empty(t, reqs)
	})
	t.Run("a file of either CSV trace", func(t *testing.T) {
		dir := t.TempDir()
		burst := filepath.Join(dir, "BurstGPT_1.csv")
		require.NoError(t, os.WriteFile(burst, []byte(burstHead+"5,ChatGPT,472,18,490,Conversation log\n45,ChatGPT,1,2,3,API log\nbroken\n"), 0o600))
		reqs, err := ParseRequestsFileFirst(burst, 2)
		require.NoError(t, err)
		require.Equal(t, []Request{{Input: 472, Output: 18}, {Arrival: 40 * time.Second, Input: 1, Output: 2}}, reqs)
		_, err = ParseRequestsFile(burst)
		requireMalformed(t, err, 4, "1 fields, want 6")

		other := filepath.Join(dir, "other.csv")
		require.NoError(t, os.WriteFile(other, []byte("time,in,out\n0,1,2\n"), 0o600))
		_, err = ParseRequestsFile(other)
		requireMalformed(t, err, 1, `header "time,in,out", want an Azure trace's TIMESTAMP,ContextTokens,GeneratedTokens or a BurstGPT trace's Timestamp,Model,`)
	})
}

func TestParseBurstGPTMalformed(t *testing.T) {
	const good = "5,ChatGPT,472,18,490,Conversation log\n"
	for _, tc := range []struct {
		name, input string
		line        int
		says        string
	}{
		{"empty", "", 1, "empty input, want the header line " + burstHeader},
		{"Azure's header", azureHead, 1, `header "TIMESTAMP,ContextTokens,GeneratedTokens", want ` + burstHeader + " or " + burstSessionHeader},
		{"header in other case", strings.ToLower(burstHeader) + "\n", 1, "header"},
		{"no Timestamp", "Model,Request tokens,Response tokens\n", 1, "(those columns in any order, Timestamp, Request tokens and Response tokens among them)"},
		{"a column twice", "Timestamp,Timestamp,Request tokens,Response tokens\n", 1, "header"},
		{"an unknown column", burstHeader + ",Price\n", 1, "header"},
		{"an empty column name", "Timestamp,,Request tokens,Response tokens\n", 1, "header"},
		{"too few fields", burstHead + "5,ChatGPT,472,18,490\n", 2, "5 fields, want 6"},
		{"session fields under the old header", burstHead + "5,id,0.5,ChatGPT,472,18,490,Conversation log\n", 2, "8 fields, want 6"},
		{"negative time", burstHead + "-5,ChatGPT,472,18,490,Conversation log\n", 2, `Timestamp "-5" is not a number of seconds of at least 0`},
		{"exponent", burstHead + "5e3,ChatGPT,472,18,490,Conversation log\n", 2, `Timestamp "5e3" is not a number of seconds`},
		{"empty time", burstHead + ",ChatGPT,472,18,490,Conversation log\n", 2, `Timestamp "" is not a number of seconds`},
		{"point and no digits", burstHead + "5.,ChatGPT,472,18,490,Conversation log\n", 2, "with 1 to 9 digits after its point"},
		{"ten digits", burstHead + "5.0123456789,ChatGPT,472,18,490,Conversation log\n", 2, "with 1 to 9 digits after its point"},
		{"no whole seconds", burstHead + ".5,ChatGPT,472,18,490,Conversation log\n", 2, `Timestamp ".5" is not a number of seconds`},
		{"huge time", burstHead + "99999999999999999999,ChatGPT,472,18,490,Conversation log\n", 2, "is over 9223372035 seconds"},
		{"backwards", burstHead + "45,ChatGPT,1,1,2,API log\n" + good, 3, "Timestamp 5 is before the previous line's 45: requests must come in arrival order"},
		{"after MaxArrival", burstHead + "0,ChatGPT,1,1,2,API log\n31536001,ChatGPT,1,1,2,API log\n", 3, "more than MaxArrival (8760h0m0s)"},
		{"negative request tokens", burstHead + "5,ChatGPT,-1,18,17,Conversation log\n", 2, `Request tokens "-1" is not an integer of at least 0`},
		{"response over MaxTokens", burstHead + "5,ChatGPT,1,16777217,16777218,Conversation log\n", 2, `Response tokens "16777217" is over MaxTokens`},
		{"quoted model", burstHead + `5,"Chat,GPT",472,18,490,Conversation log` + "\n", 2, "7 fields, want 6"},
		{"empty line", burstHead + good + "\n" + good, 3, "empty line"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reqs, err := ParseBurstGPT(strings.NewReader(tc.input))
			require.Nil(t, reqs)
			requireMalformed(t, err, tc.line, tc.says)
		})
	}
}

// bailianLine is a Bailian trace's line in the dataset's field order.
func bailianLine(chat, parent int, ts string, input, output int, ids string) string {
	return fmt.Sprintf(`{"chat_id": %d, "parent_chat_id": %d, "timestamp": %s, "input_length": %d, "output_length": %d, "type": "text", "turn": 1, "hash_ids": [%s]}`+"\n",
		chat, parent, ts, input, output, ids)
}

// TestParseBailian: lines in the form of the Qwen-Bailian dataset's
// (made up in it, not copied from its files).
func TestParseBailian(t *testing.T) {
	reqs, err := ParseBailian(strings.NewReader(
		bailianLine(0, -1, "0.0", 40, 3, "1, 2, 3") +
			bailianLine(1, 0, "61.114", 33, 132, "1, 2, 3") + // 33 tokens: three blocks, the last of 1
			bailianLine(2, -1, "61.114", 0, 1, "") +
			bailianLine(3, 1, "1e2", 48, 2, "9, 9") + // an exponent; an id twice; fewer blocks than the prompt's
			`{"timestamp":7199.97,"input_length":16,"output_length":0,"hash_ids":[4],"chat_id":4}`)) // the required fields alone, no final LF
	require.NoError(t, err)
	require.Equal(t, []Request{
		{Input: 40, Output: 3, Blocks: []int64{1, 2, 3}, BlockTokens: 16},
		{Arrival: 61114 * time.Millisecond, Input: 33, Output: 132, Blocks: []int64{1, 2, 3}, BlockTokens: 16},
		{Arrival: 61114 * time.Millisecond, Input: 0, Output: 1, Blocks: []int64{}, BlockTokens: 16},
		{Arrival: 100 * time.Second, Input: 48, Output: 2, Blocks: []int64{9, 9}, BlockTokens: 16},
		{Arrival: 7199970 * time.Millisecond, Input: 16, Blocks: []int64{4}, BlockTokens: 16},
	}, reqs)
	for _, r := range reqs {
		require.Equal(t, 16, r.BlockSize())
	}

	t.Run("a file of either JSON lines trace", func(t *testing.T) {
		dir := t.TempDir()
		name := filepath.Join(dir, "qwen_traceA_blksz_16.jsonl")
		require.NoError(t, os.WriteFile(name, []byte("\ufeff"+bailianLine(0, -1, "0.5", 20, 1, "1, 2")+bailianLine(1, 0, "1.5", 20, 1, "1, 2")+"{\n"), 0o600))
		reqs, err := ParseRequestsFileFirst(name, 2)
		require.NoError(t, err)
		require.Equal(t, []Request{{Input: 20, Output: 1, Blocks: []int64{1, 2}, BlockTokens: 16},
			{Arrival: time.Second, Input: 20, Output: 1, Blocks: []int64{1, 2}, BlockTokens: 16}}, reqs)
		_, err = ParseRequestsFile(name)
		requireMalformed(t, err, 3, "the line ends where the object's end belongs")
		empty := filepath.Join(dir, "empty.jsonl")
		require.NoError(t, os.WriteFile(empty, nil, 0o600))
		reqs, err = ParseRequestsFile(empty)
		require.NoError(t, err)
		require.Empty(t, reqs)
		// A first line that cannot tell the format is the error.
		blank := filepath.Join(dir, "blank.jsonl")
		require.NoError(t, os.WriteFile(blank, []byte("\n"+bailianLine(0, -1, "0.5", 20, 1, "1, 2")), 0o600))
		_, err = ParseRequestsFile(blank)
		requireMalformed(t, err, 1, "empty line")
	})
}

func TestParseBailianMalformed(t *testing.T) {
	good := bailianLine(0, -1, "0", 20, 1, "1, 2")
	for _, tc := range []struct {
		name, input string
		line        int
		says        string
	}{
		{"not an object", "[1]\n", 1, "'[' where a JSON object belongs"},
		{"no chat_id", `{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1], "turn": 1}` + "\n", 1, "no field chat_id"},
		{"no hash_ids", `{"chat_id": 0, "timestamp": 0, "input_length": 1, "output_length": 1}` + "\n", 1, "no field hash_ids"},
		{"unknown field", `{"chat_id": 0, "timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [], "user": 3}` + "\n", 1, `unknown field "user"`},
		{"a field twice", `{"chat_id": 0, "chat_id": 1, "timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": []}` + "\n", 1, "field chat_id twice"},
		{"negative timestamp", good + bailianLine(1, -1, "-1.5", 20, 1, "1"), 2, `timestamp "-1.5" is not a number of seconds from 0`},
		{"huge timestamp", bailianLine(1, -1, "1e300", 20, 1, "1"), 1, `timestamp "1e300" is not a number of seconds from 0 to 9223372035`},
		{"timestamp a string", strings.Replace(good, `"timestamp": 0`, `"timestamp": "0"`, 1), 1, "timestamp"},
		{"backwards", bailianLine(0, -1, "5.25", 20, 1, "1") + bailianLine(1, -1, "5.125", 20, 1, "1"), 2, "timestamp 5.125 is before the previous line's 5.25"},
		{"after MaxArrival", bailianLine(0, -1, "0", 20, 1, "1") + bailianLine(1, -1, "31536001", 20, 1, "1"), 2, "timestamp 31536001 is 8760h0m1s after the first request's, more than MaxArrival (8760h0m0s)"},
		{"fractional length", strings.Replace(good, `"input_length": 20`, `"input_length": 20.5`, 1), 1, "input_length"},
		{"parent under -1", bailianLine(0, -2, "0", 20, 1, "1"), 1, `parent_chat_id "-2" is not an integer of at least -1`},
		{"negative chat", bailianLine(-1, -1, "0", 20, 1, "1"), 1, "chat_id"},
		{"type a number", strings.Replace(good, `"type": "text"`, `"type": 3`, 1), 1, `type is the number "3", want a string`},
		{"type an object", strings.Replace(good, `"type": "text"`, `"type": {}`, 1), 1, "type is '{', want a string"},
		{"too many hash_ids", bailianLine(0, -1, "0", 17, 1, "1, 2, 3"), 1, "3 hash_ids for input_length 17, want at most 2 (one per 16 tokens"},
		{"hash_id not an integer", bailianLine(0, -1, "0", 17, 1, "1.5"), 1, `hash_ids[0] "1.5" is not an integer`},
		{"two objects", strings.TrimSuffix(good, "\n") + "{}\n", 1, "more after the object's end"},
		{"empty line", good + "\n" + good, 2, "empty line"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reqs, err := ParseBailian(strings.NewReader(tc.input))
			require.Nil(t, reqs)
			requireMalformed(t, err, tc.line, tc.says)
		})
	}
}

func TestParseMooncake(t *testing.T) {
	reqs, err := ParseMooncake(strings.NewReader(
		`{"timestamp": 5, "input_length": 1025, "output_length": 6, "hash_ids": [0, 1, 2]}` + "\n" +
			`{"timestamp": 5, "input_length": 512, "output_length": 0, "hash_ids": [0]}` + "\n" + // the first block again
			`{"hash_ids":[0,1,7,-9223372036854775808],"output_length":1,"input_length":1537,"timestamp":1040}` + "\n" + // any order, no spaces
			` { "timestamp" : 1041 , "input_length" : 0 , "output_length" : 16777216 , "hash_ids" : [ ] } ` + "\n" +
			`{"timestamp": 1041, "input_length": 1, "output_length": 1, "hash_ids": [9223372036854775807]}`))
	require.NoError(t, err)
	require.Equal(t, []Request{
		{Arrival: 0, Input: 1025, Output: 6, Blocks: []int64{0, 1, 2}},
		{Arrival: 0, Input: 512, Output: 0, Blocks: []int64{0}},
		{Arrival: 1035 * time.Millisecond, Input: 1537, Output: 1, Blocks: []int64{0, 1, 7, -1 << 63}},
		{Arrival: 1036 * time.Millisecond, Input: 0, Output: MaxTokens, Blocks: []int64{}},
		{Arrival: 1036 * time.Millisecond, Input: 1, Output: 1, Blocks: []int64{1<<63 - 1}},
	}, reqs)
	require.NotNil(t, reqs[3].Blocks, "a Mooncake request always has Blocks, empty for an empty prompt")

	t.Run("empty input", func(t *testing.T) {
		reqs, err := ParseMooncake(strings.NewReader(""))
		require.NoError(t, err)
		require.Empty(t, reqs)
	})
	t.Run("CRLF and a byte-order mark", func(t *testing.T) {
		reqs, err := ParseMooncake(strings.NewReader("\ufeff" + `{"timestamp": 0, "input_length": 1, "output_length": 2, "hash_ids": [3]}` + "\r\n"))
		require.NoError(t, err)
		require.Equal(t, []Request{{Input: 1, Output: 2, Blocks: []int64{3}}}, reqs)
	})
}

// TestParseMooncakeN: the optional field n is Request.N, 1 to MaxN, in
// any place in the object; without it N is 0, one sequence.
func TestParseMooncakeN(t *testing.T) {
	reqs, err := ParseMooncake(strings.NewReader(
		`{"timestamp": 0, "input_length": 600, "output_length": 6, "hash_ids": [0, 1], "n": 4}` + "\n" +
			`{"n": 256, "timestamp": 1, "input_length": 1, "output_length": 2, "hash_ids": [3]}` + "\n" +
			`{"timestamp": 2, "input_length": 1, "output_length": 2, "hash_ids": [3]}` + "\n"))
	require.NoError(t, err)
	require.Len(t, reqs, 3)
	require.Equal(t, []int{4, 256, 0}, []int{reqs[0].N, reqs[1].N, reqs[2].N})
	require.Equal(t, []int{4, 256, 1}, []int{seqs(reqs[0]), seqs(reqs[1]), seqs(reqs[2])})
}

func TestParseMooncakeMalformed(t *testing.T) {
	good := `{"timestamp": 10, "input_length": 600, "output_length": 6, "hash_ids": [0, 1]}` + "\n"
	line := func(ts, in, out, ids string) string {
		return `{"timestamp": ` + ts + `, "input_length": ` + in + `, "output_length": ` + out + `, "hash_ids": ` + ids + "}\n"
	}
	for _, tc := range []struct {
		name, input string
		line        int
		says        string
	}{
		{"empty line", good + "\n" + good, 2, "empty line"},
		{"blank last line", good + "\n", 2, "empty line"},
		{"spaces only", good + "   \n", 2, "the line ends where a JSON object belongs"},
		{"not JSON", good + "timestamp=1\n", 2, "not JSON: invalid character 'i'"},
		{"an array", "[1, 2]\n", 1, "'[' where a JSON object belongs"},
		{"a string", `"x"` + "\n", 1, `the string "x" where a JSON object belongs`},
		{"unterminated", `{"timestamp": 10, "input_length": 600` + "\n", 1, "the line ends where the object's end belongs"},
		{"unterminated after a key", `{"timestamp": 10, "input_length"` + "\n", 1, "the line ends inside the object"},
		{"unterminated array", `{"timestamp": 10, "input_length": 600, "output_length": 6, "hash_ids": [0, ` + "\n", 1, "the line ends inside the object"},
		{"unknown field", `{"timestamp": 10, "input_length": 600, "output_length": 6, "hash_ids": [0, 1], "model": "x"}` + "\n", 1,
			`unknown field "model", want the fields timestamp, input_length, output_length, hash_ids (and optionally n)`},
		{"field in another case", `{"Timestamp": 10, "input_length": 600, "output_length": 6, "hash_ids": [0, 1]}` + "\n", 1, `unknown field "Timestamp"`},
		{"missing field", `{"timestamp": 10, "input_length": 600, "hash_ids": [0, 1]}` + "\n", 1, "no field output_length"},
		{"field twice", `{"timestamp": 10, "timestamp": 11, "input_length": 600, "output_length": 6, "hash_ids": [0, 1]}` + "\n", 1, "field timestamp twice"},
		{"two objects", good[:len(good)-1] + good, 1, "more after the object's end"},
		{"trailing comma", good[:len(good)-1] + ",\n", 1, "more after the object's end"},
		{"fractional timestamp", line("10.5", "600", "6", "[0, 1]"), 1, `timestamp "10.5" is not an integer`},
		{"exponent", line("1e3", "600", "6", "[0, 1]"), 1, `timestamp "1e3" is not an integer`},
		{"timestamp as a string", line(`"10"`, "600", "6", "[0, 1]"), 1, `timestamp is the string "10", want an integer`},
		{"null length", line("10", "null", "6", "[0, 1]"), 1, "input_length is null, want an integer"},
		{"bool length", line("10", "600", "true", "[0, 1]"), 1, "output_length is true, want an integer"},
		{"negative timestamp", line("-1", "600", "6", "[0, 1]"), 1, `timestamp "-1" is negative`},
		{"negative length", line("10", "-600", "6", "[0, 1]"), 1, `input_length "-600" is negative`},
		{"hugely negative length", line("10", "600", "-99999999999999999999", "[0, 1]"), 1, `output_length "-99999999999999999999" is negative`},
		{"input over MaxTokens", line("10", "16777217", "6", "[0, 1]"), 1, `input_length "16777217" is over 16777216`},
		{"timestamp out of range", line("9223372036854775808", "600", "6", "[0, 1]"), 1, "is over 9223372036854775807"},
		{"hash_ids null", line("10", "600", "6", "null"), 1, "null where hash_ids as an array of integers belongs"},
		{"hash_ids an object", line("10", "600", "6", "{}"), 1, "'{' where hash_ids as an array of integers belongs"},
		{"hash id a string", line("10", "600", "6", `[0, "1"]`), 1, `hash_ids[1] is the string "1", want an integer`},
		{"hash id fractional", line("10", "600", "6", `[0.5, 1]`), 1, `hash_ids[0] "0.5" is not an integer`},
		{"hash id out of range", line("10", "600", "6", `[0, 9223372036854775808]`), 1, `hash_ids[1] "9223372036854775808" is not an integer (out of range)`},
		{"nested hash ids", line("10", "600", "6", `[[0], 1]`), 1, "hash_ids[0] is '[', want an integer"},
		{"too few hash ids", good + line("10", "1025", "6", "[0, 1]"), 2, "2 hash_ids for input_length 1025, want 3 (one per 512 tokens, the last one partial)"},
		{"too many hash ids", line("10", "512", "6", "[0, 1]"), 1, "2 hash_ids for input_length 512, want 1"},
		{"hash ids for no prompt", line("10", "0", "6", "[0]"), 1, "1 hash_ids for input_length 0, want 0"},
		{"an id twice in a request", line("10", "1024", "6", "[4, 4]"), 1, "hash_ids[1] is 4 after 4 here but starting the prompt on line 1"},
		{"an id after another prefix", good + line("11", "1536", "6", "[2, 0, 1]"), 2, "hash_ids[1] is 0 after 2 here but starting the prompt on line 1"},
		{"an id starting a prompt it did not start", good + line("11", "512", "6", "[1]"), 2, "hash_ids[0] is 1 starting the prompt here but after 0 on line 1"},
		{"backwards", good + line("9", "600", "6", "[0, 1]"), 2, "timestamp 9 is before the previous line's 10: requests must come in arrival order"},
		{"n zero", `{"timestamp": 10, "input_length": 600, "output_length": 6, "hash_ids": [0, 1], "n": 0}` + "\n", 1, "n 0 is under 1"},
		{"n negative", `{"n": -2, "timestamp": 10, "input_length": 600, "output_length": 6, "hash_ids": [0, 1]}` + "\n", 1, `n "-2" is negative`},
		{"n over MaxN", `{"timestamp": 10, "input_length": 600, "output_length": 6, "hash_ids": [0, 1], "n": 257}` + "\n", 1, `n "257" is over 256`},
		{"n twice", `{"timestamp": 10, "n": 2, "input_length": 600, "output_length": 6, "hash_ids": [0, 1], "n": 3}` + "\n", 1, "field n twice"},
		{"n fractional", `{"timestamp": 10, "input_length": 600, "output_length": 6, "hash_ids": [0, 1], "n": 1.5}` + "\n", 1, `n "1.5" is not an integer`},
		{"after MaxArrival", good + line("31536000011", "600", "6", "[0, 1]"), 2, "timestamp 31536000011 is 8760h0m0.001s after the first request's, more than MaxArrival"},
		{"past the largest Duration after the first", good + line("9223372036854775807", "600", "6", "[0, 1]"), 2, "timestamp 9223372036854775807 is 9223372036854775797ms after the first request's, more than MaxArrival"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reqs, err := ParseMooncake(strings.NewReader(tc.input))
			require.Nil(t, reqs)
			requireMalformed(t, err, tc.line, tc.says)
		})
	}
}

// TestRequestLineBound: a line of MaxRequestLineBytes is read, with either
// line ending; one byte more is an error naming its line, however long.
func TestRequestLineBound(t *testing.T) {
	const head = `{"timestamp": 0, "input_length": 0, "output_length": 0, "hash_ids": []`
	padded := func(n int) string { return head + strings.Repeat(" ", n-len(head)-1) + "}" }
	good := `{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1]}` + "\n"
	for _, end := range []string{"\n", "\r\n", ""} {
		reqs, err := ParseMooncake(strings.NewReader(good + padded(MaxRequestLineBytes) + end))
		require.NoError(t, err)
		require.Len(t, reqs, 2)
		for _, n := range []int{MaxRequestLineBytes + 1, MaxRequestLineBytes + 2, 3 * MaxRequestLineBytes} {
			reqs, err := ParseMooncake(strings.NewReader(good + padded(n) + end + good))
			require.Nil(t, reqs)
			requireMalformed(t, err, 2, "longer than 1048576 bytes (MaxRequestLineBytes)")
		}
	}
	reqs, err := ParseAzure(strings.NewReader(azureHead + strings.Repeat("9", MaxRequestLineBytes+1)))
	require.Nil(t, reqs)
	requireMalformed(t, err, 2, "longer than")

	t.Run("the largest request fits", func(t *testing.T) {
		// MaxTokens of prompt in blocks whose ids take 20 characters.
		var b strings.Builder
		b.WriteString(`{"timestamp": 0, "input_length": 16777216, "output_length": 16777216, "hash_ids": [`)
		for i := range MaxTokens / BlockTokens {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(strconv.FormatInt(-1<<63+int64(i), 10))
		}
		b.WriteString("]}\n")
		require.LessOrEqual(t, b.Len(), MaxRequestLineBytes)
		reqs, err := ParseMooncake(strings.NewReader(b.String()))
		require.NoError(t, err)
		require.Len(t, reqs[0].Blocks, MaxTokens/BlockTokens)
	})
}

// TestParseRequestsNilReader: a nil (or typed-nil) reader is
// driver.ErrInvalid, not a panic.
func TestParseRequestsNilReader(t *testing.T) {
	for _, r := range []io.Reader{nil, (*strings.Reader)(nil), (*os.File)(nil)} {
		_, err := ParseAzure(r)
		drivertest.RequireIs(t, err, driver.ErrInvalid, "the reader is nil")
		_, err = ParseBurstGPT(r)
		drivertest.RequireIs(t, err, driver.ErrInvalid, "the reader is nil")
		_, err = ParseBailian(r)
		drivertest.RequireIs(t, err, driver.ErrInvalid, "the reader is nil")
		_, err = ParseMooncake(r)
		drivertest.RequireIs(t, err, driver.ErrInvalid, "the reader is nil")
	}
}

// failingReader fails after its content.
type failingReader struct{ r io.Reader }

func (f failingReader) Read(p []byte) (int, error) {
	n, err := f.r.Read(p)
	if err == io.EOF {
		return n, errors.New("disk on fire")
	}
	return n, err
}

// TestParseRequestsReadError: a reader's failure is its own error, not a
// malformed trace.
func TestParseRequestsReadError(t *testing.T) {
	_, err := ParseAzure(failingReader{strings.NewReader(azureHead)})
	require.ErrorContains(t, err, "serving: read: disk on fire")
	require.False(t, errors.Is(err, ErrMalformed))
	_, err = ParseBurstGPT(failingReader{strings.NewReader(burstHead + "5,ChatGPT,1,2,3,API log\n")})
	require.ErrorContains(t, err, "serving: read: disk on fire")
	require.False(t, errors.Is(err, ErrMalformed))
	_, err = ParseMooncake(failingReader{strings.NewReader("")})
	require.ErrorContains(t, err, "serving: read: disk on fire")
	require.False(t, errors.Is(err, ErrMalformed))
}

// TestParseRequestsFile reads the slices of the real traces in
// testdata/requests and checks figures worked out from the files with awk:
//
//	awk -F, 'NR>1 {n++; c+=$2; g+=$3}' AzureLLMInferenceTrace_*.csv
//	awk -F'[:,]' '{n++; i+=$4; o+=$6; ts=$2}' mooncake_synthetic_trace.jsonl
//
// and, for the hash ids, the count and the distinct count of the ids
// between each line's brackets.
func TestParseRequestsFile(t *testing.T) {
	for _, tc := range []struct {
		file                    string
		requests, input, output int
		last                    time.Duration
		blocks, distinct        int
	}{
		{"AzureLLMInferenceTrace_conv.csv", 199, 179552, 46641, 61*time.Second + 145266*time.Microsecond, 0, 0}, // 18:15:46.6805900 to 18:16:47.8258560
		{"AzureLLMInferenceTrace_code.csv", 199, 414150, 4897, 3*time.Minute + 19073379*time.Microsecond, 0, 0}, // 18:17:03.9799600 to 18:20:23.0533390
		{"mooncake_synthetic_trace.jsonl", 200, 2663480, 38364, 58501 * time.Millisecond, 5330, 5007},
	} {
		t.Run(tc.file, func(t *testing.T) {
			reqs, err := ParseRequestsFile(filepath.Join("testdata", "requests", tc.file))
			require.NoError(t, err)
			require.Len(t, reqs, tc.requests)
			kind := noBlocks
			if tc.blocks > 0 {
				kind = mooncakeBlocks
			}
			checkRequests(t, reqs, kind)
			var input, output, blocks int
			distinct := map[int64]bool{}
			for _, r := range reqs {
				input += r.Input
				output += r.Output
				blocks += len(r.Blocks)
				for _, id := range r.Blocks {
					distinct[id] = true
				}
			}
			require.Equal(t, tc.input, input)
			require.Equal(t, tc.output, output)
			require.Equal(t, tc.last, reqs[len(reqs)-1].Arrival)
			require.Equal(t, tc.blocks, blocks)
			require.Len(t, distinct, tc.distinct)
		})
	}
	t.Run("another extension", func(t *testing.T) {
		_, err := ParseRequestsFile(filepath.Join("testdata", "requests", "README.md"))
		drivertest.RequireIs(t, err, driver.ErrInvalid, `no request trace format for extension ".md"`)
		require.Contains(t, errors.FlattenHints(err), ".csv")
	})
	t.Run("no such file", func(t *testing.T) {
		_, err := ParseRequestsFile(filepath.Join(t.TempDir(), "none.jsonl"))
		require.ErrorIs(t, err, os.ErrNotExist)
	})
	t.Run("the first requests", func(t *testing.T) {
		for _, file := range []string{"AzureLLMInferenceTrace_conv.csv", "mooncake_synthetic_trace.jsonl"} {
			all, err := ParseRequestsFile(filepath.Join("testdata", "requests", file))
			require.NoError(t, err)
			for _, n := range []int{1, 10, len(all), len(all) + 1} {
				reqs, err := ParseRequestsFileFirst(filepath.Join("testdata", "requests", file), n)
				require.NoError(t, err)
				require.Equal(t, all[:min(n, len(all))], reqs, "%s, first %d", file, n)
			}
			reqs, err := ParseRequestsFileFirst(filepath.Join("testdata", "requests", file), 0)
			require.NoError(t, err)
			require.Equal(t, all, reqs, "%s, n 0: all", file)
		}
	})
	t.Run("the lines after the first requests are not read", func(t *testing.T) {
		dir := t.TempDir()
		azure := filepath.Join(dir, "trace.csv")
		require.NoError(t, os.WriteFile(azure, []byte(azureHead+"2024-05-10 00:00:00.009930+00:00,1,2\nnot a request\n"), 0o600))
		mooncake := filepath.Join(dir, "trace.jsonl")
		require.NoError(t, os.WriteFile(mooncake, []byte(`{"timestamp": 0, "input_length": 1, "output_length": 2, "hash_ids": [0]}`+"\n{\n"), 0o600))
		for _, name := range []string{azure, mooncake} {
			reqs, err := ParseRequestsFileFirst(name, 1)
			require.NoError(t, err)
			require.Len(t, reqs, 1)
			require.Equal(t, Request{Input: 1, Output: 2, Blocks: reqs[0].Blocks}, reqs[0])
			_, err = ParseRequestsFileFirst(name, 2)
			requireMalformed(t, err, map[string]int{azure: 3, mooncake: 2}[name], "")
		}
	})
	t.Run("extension in capitals", func(t *testing.T) {
		name := filepath.Join(t.TempDir(), "trace.CSV")
		require.NoError(t, os.WriteFile(name, []byte(azureHead+"2023-11-16 18:15:46,1,2\n"), 0o600))
		reqs, err := ParseRequestsFile(name)
		require.NoError(t, err)
		require.Equal(t, []Request{{Input: 1, Output: 2}}, reqs)
	})
}

// traceKind is what a trace's requests name of their prompts: no blocks
// (Azure, BurstGPT), Mooncake's chained 512-token blocks, or Bailian's
// 16-token blocks hashed alone.
type traceKind int

const (
	noBlocks traceKind = iota
	mooncakeBlocks
	bailianBlocks
)

// checkRequests: the invariants Request documents, checked apart from the
// readers' own bookkeeping: prefixes are compared whole.
func checkRequests(t *testing.T, reqs []Request, kind traceKind) {
	t.Helper()
	prefix := map[int64]string{} // each id's prompt before it
	for i, r := range reqs {
		if i == 0 {
			require.Zero(t, r.Arrival, "the first request arrives at 0")
		} else {
			require.GreaterOrEqual(t, r.Arrival, reqs[i-1].Arrival, "request %d arrives before the one before", i)
		}
		require.LessOrEqual(t, r.Arrival, MaxArrival)
		require.True(t, 0 <= r.Input && r.Input <= MaxTokens, "request %d: input %d", i, r.Input)
		require.True(t, 0 <= r.Output && r.Output <= MaxTokens, "request %d: output %d", i, r.Output)
		switch kind {
		case noBlocks:
			require.Nil(t, r.Blocks)
			require.Zero(t, r.BlockTokens)
			continue
		case bailianBlocks:
			require.NotNil(t, r.Blocks)
			require.Equal(t, 16, r.BlockTokens)
			require.LessOrEqual(t, len(r.Blocks), (r.Input+15)/16)
			continue
		}
		require.NotNil(t, r.Blocks)
		require.Zero(t, r.BlockTokens)
		require.Len(t, r.Blocks, (r.Input+BlockTokens-1)/BlockTokens)
		for j, id := range r.Blocks {
			p := fmt.Sprint(r.Blocks[:j])
			if q, ok := prefix[id]; ok {
				require.Equal(t, q, p, "request %d: block %d", i, id)
			}
			prefix[id] = p
		}
	}
}

// encodeAzure writes reqs as an Azure trace, from an arbitrary first time.
func encodeAzure(reqs []Request) string {
	start := time.Date(2023, 11, 16, 18, 15, 46, 680590000, time.UTC)
	var b strings.Builder
	b.WriteString(azureHead)
	for _, r := range reqs {
		fmt.Fprintf(&b, "%s,%d,%d\n", start.Add(r.Arrival).Format(azureTimeLayout+".000000000"), r.Input, r.Output)
	}
	return b.String()
}

// encodeBurstGPT writes reqs as a BurstGPT trace, from an arbitrary
// first time.
func encodeBurstGPT(reqs []Request) string {
	var b strings.Builder
	b.WriteString(burstHead)
	for _, r := range reqs {
		at := 5*time.Second + r.Arrival
		fmt.Fprintf(&b, "%d.%09d,ChatGPT,%d,%d,%d,Conversation log\n", at/time.Second, at%time.Second, r.Input, r.Output, r.Input+r.Output)
	}
	return b.String()
}

// encodeBailian writes reqs as a Bailian trace, from an arbitrary first
// time.
func encodeBailian(reqs []Request) string {
	var b strings.Builder
	for i, r := range reqs {
		at := 2*time.Second + r.Arrival
		b.WriteString(bailianLine(i, -1, fmt.Sprintf("%d.%09d", at/time.Second, at%time.Second), r.Input, r.Output, joinIDs(r.Blocks)))
	}
	return b.String()
}

// encodeMooncake writes reqs as a Mooncake trace, as the real one is
// written.
func encodeMooncake(reqs []Request) string {
	var b strings.Builder
	for _, r := range reqs {
		n := ""
		if r.N != 0 {
			n = fmt.Sprintf(`, "n": %d`, r.N)
		}
		fmt.Fprintf(&b, `{"timestamp": %d, "input_length": %d, "output_length": %d, "hash_ids": [%s]%s}`+"\n",
			r.Arrival/time.Millisecond, r.Input, r.Output, joinIDs(r.Blocks), n)
	}
	return b.String()
}

// joinIDs writes hash ids as a trace's hash_ids list holds them.
func joinIDs(ids []int64) string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = strconv.FormatInt(id, 10)
	}
	return strings.Join(s, ", ")
}

// TestRequestsRoundTrip: the slices of the real traces, written again and
// read again, are the same requests.
func TestRequestsRoundTrip(t *testing.T) {
	for _, name := range []string{"AzureLLMInferenceTrace_conv.csv", "AzureLLMInferenceTrace_code.csv", "mooncake_synthetic_trace.jsonl"} {
		reqs, err := ParseRequestsFile(filepath.Join("testdata", "requests", name))
		require.NoError(t, err)
		parse, encode := ParseAzure, encodeAzure
		if strings.HasSuffix(name, ".jsonl") {
			parse, encode = ParseMooncake, encodeMooncake
		}
		again, err := parse(strings.NewReader(encode(reqs)))
		require.NoError(t, err)
		require.Equal(t, reqs, again, name)
	}
}

var lineOfError = regexp.MustCompile(`^serving: line ([0-9]+): `)

// fuzzRequests is the body of both fuzz targets: the reader never panics;
// it fails with ErrMalformed naming a line of the input, or returns
// requests that keep Request's invariants and survive being written and
// read again.
func fuzzRequests(t *testing.T, s string, parse func(io.Reader) ([]Request, error), encode func([]Request) string, kind traceKind) {
	reqs, err := parse(strings.NewReader(s))
	if err != nil {
		require.Nil(t, reqs)
		require.True(t, errors.Is(err, ErrMalformed), "%v", err)
		m := lineOfError.FindStringSubmatch(err.Error())
		require.NotNil(t, m, "the error names no line: %v", err)
		line, _ := strconv.Atoi(m[1])
		require.True(t, 1 <= line && line <= strings.Count(s, "\n")+1, "line %d of an input of %d lines: %v", line, strings.Count(s, "\n")+1, err)
		return
	}
	checkRequests(t, reqs, kind)
	again, err := parse(strings.NewReader(encode(reqs)))
	require.NoError(t, err)
	require.Equal(t, reqs, again)
}

// FuzzParseAzure: see fuzzRequests; the seeds are in
// testdata/fuzz/FuzzParseAzure.
func FuzzParseAzure(f *testing.F) {
	f.Fuzz(func(t *testing.T, s string) { fuzzRequests(t, s, ParseAzure, encodeAzure, noBlocks) })
}

// FuzzParseBurstGPT: see fuzzRequests; the seeds are in
// testdata/fuzz/FuzzParseBurstGPT.
func FuzzParseBurstGPT(f *testing.F) {
	f.Fuzz(func(t *testing.T, s string) { fuzzRequests(t, s, ParseBurstGPT, encodeBurstGPT, noBlocks) })
}

// FuzzParseBailian: see fuzzRequests; the seeds are in
// testdata/fuzz/FuzzParseBailian.
func FuzzParseBailian(f *testing.F) {
	f.Fuzz(func(t *testing.T, s string) { fuzzRequests(t, s, ParseBailian, encodeBailian, bailianBlocks) })
}

// FuzzParseMooncake: see fuzzRequests; the seeds are in
// testdata/fuzz/FuzzParseMooncake.
func FuzzParseMooncake(f *testing.F) {
	f.Fuzz(func(t *testing.T, s string) { fuzzRequests(t, s, ParseMooncake, encodeMooncake, mooncakeBlocks) })
}

// TestRequestFuzzSeeds: the seed corpus says what its names say: the
// seeds named valid_* parse, every other one is malformed.
func TestRequestFuzzSeeds(t *testing.T) {
	for fuzz, parse := range map[string]func(io.Reader) ([]Request, error){
		"FuzzParseAzure": ParseAzure, "FuzzParseBailian": ParseBailian, "FuzzParseBurstGPT": ParseBurstGPT, "FuzzParseMooncake": ParseMooncake} {
		dir := filepath.Join("testdata", "fuzz", fuzz)
		entries, err := os.ReadDir(dir)
		require.NoError(t, err)
		require.NotEmpty(t, entries)
		for _, e := range entries {
			b, err := os.ReadFile(filepath.Join(dir, e.Name()))
			require.NoError(t, err)
			quoted, ok := strings.CutPrefix(strings.TrimSpace(string(b)), "go test fuzz v1\nstring(")
			require.True(t, ok, "%s/%s is not a seed of one string", fuzz, e.Name())
			s, err := strconv.Unquote(strings.TrimSuffix(quoted, ")"))
			require.NoError(t, err, "%s/%s", fuzz, e.Name())
			_, err = parse(strings.NewReader(s))
			if strings.HasPrefix(e.Name(), "valid_") {
				require.NoError(t, err, "%s/%s", fuzz, e.Name())
			} else {
				require.True(t, errors.Is(err, ErrMalformed), "%s/%s: %v", fuzz, e.Name(), err)
			}
		}
	}
}
