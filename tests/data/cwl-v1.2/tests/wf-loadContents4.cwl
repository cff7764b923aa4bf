cwlVersion: v1.2
class: Workflow
requirements:
  StepInputExpressionRequirement: {}
  InlineJavascriptRequirement: {}
inputs:
  my_file: File

steps:
  one:
    run:
      class: ExpressionTool
      requirements: { InlineJavascriptRequirement: {} }
      inputs: { my_number: int }
      outputs: { my_int: int }
      expression: |
        ${ return { "my_int": inputs.my_number }; }
    in:
      my_number:
        source: my_file
        loadContents: true
        valueFrom: $(parseInt(self.contents))
    out: [ my_int ]

outputs:
  my_int:
    type: int
    outputSource: one/my_int