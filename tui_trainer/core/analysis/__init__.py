"""What runs mean: figures, verdicts, divergence and its explanation, studies and their statistics, the plot data and the pictures' data."""
