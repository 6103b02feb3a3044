package frontend

import "strings"

// estimateTokens is the frontend's count of a prompt's tokens, for
// admission (--max-prompt-tokens) and --migration-max-seq-len before an
// engine has counted them: its whitespace-separated words, which is exact
// for the mock engine. Once an engine reports its own count (its prompt
// token ids, its usage), usage and --migration-max-seq-len use that instead.
func estimateTokens(prompt string) int { return len(strings.Fields(prompt)) }
