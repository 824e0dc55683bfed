"""The report: JSON contract, the study, terminal tables, the HTML page, advice."""
