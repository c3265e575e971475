package evaluate

import (
	"encoding/json"
	"fmt"
	"os"

	"distflash/runplot"
)

// The pictures of eval's reports (eval --plot, plot --positions), drawn by runplot.

// PlotPositions draws the loss by position of reports into out (.png or .svg), one line per
// report, named by names (nil: by the model each report evaluated), under a title that says
// what the last one scored.
func PlotPositions(out string, reports []Report, names []string) error {
	var series []runplot.PositionSeries
	title := "loss by position"
	for i, r := range reports {
		name := r.Model
		if names != nil {
			name = names[i]
		}
		p := r.Positions
		series = append(series, runplot.PositionSeries{Name: name, Lo: p.Lo, Hi: p.Hi, Loss: p.Loss, Tokens: p.Tokens, TrainLen: r.TrainSeqLen})
		title = fmt.Sprintf("loss by position: %d samples of %s, %s", r.Samples, r.Data, r.Scoring)
	}
	return runplot.WritePositions(out, title, series)
}

// ReadPositionReports reads eval reports that hold the loss by position (eval --positions).
func ReadPositionReports(paths []string) ([]Report, error) {
	var reports []Report
	for _, path := range paths {
		raw, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		var r Report
		if err := json.Unmarshal(raw, &r); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if r.Positions == nil {
			return nil, fmt.Errorf("%s has no loss by position: run eval with --positions", path)
		}
		reports = append(reports, r)
	}
	return reports, nil
}

// PlotPasskey draws the result's two scorings, generated and teacher-forced, as heat maps of
// accuracy by length and depth side by side into out (.png or .svg).
func PlotPasskey(out, title string, r PasskeyResult) error {
	return runplot.WritePasskey(out, title, []runplot.PasskeyGrid{
		{Title: "generated (greedy)", Lengths: r.Lengths, Depths: r.Depths, Correct: r.Generated.Correct, Trials: r.Generated.Trials},
		{Title: "teacher-forced", Lengths: r.Lengths, Depths: r.Depths, Correct: r.Forced.Correct, Trials: r.Forced.Trials},
	})
}
